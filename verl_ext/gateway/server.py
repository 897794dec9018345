"""The gateway's HTTP layer (FastAPI): OpenAI-shaped endpoints per session, errors in OpenAI's error shape (in
Anthropic's on the Messages endpoint).

- ``POST /sessions/{id}/v1/chat/completions``: one turn (``stream`` true: server-sent events);
- ``POST /sessions/{id}/v1/messages``: one turn in the Anthropic Messages shape (``verl_ext.gateway.anthropic``);
- ``POST /sessions/{id}/v1/responses``: one turn in the OpenAI Responses shape (``verl_ext.gateway.responses``);
- ``GET /sessions/{id}/v1/models``: the served model;
- ``POST /sessions/{id}/open``: open a session (where sessions are opened explicitly);
- ``POST /sessions/{id}/end``: end it; every branch is checked and recorded, and summarized in the answer.

Every error is a JSON body in the API's shape: a client's fault a 4xx naming the field (an unknown path 404, a wrong
method 405, a body over ``MAX_BODY_BYTES`` 413), and a fault of the server's own a 500 ``internal_error`` (the
session left as it was before the request).

``ServerThread`` runs an app with uvicorn in a thread of its own, on a port given or a free one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException

from verl_ext.gateway.anthropic import add_messages_route, is_messages_path
from verl_ext.gateway.anthropic_response import anthropic_error
from verl_ext.gateway.conclude import BranchResult
from verl_ext.gateway.errors import GatewayError, bad_request
from verl_ext.gateway.request import error_for_bad_json, parse_chat_request
from verl_ext.gateway.response import completion_body, stream_events
from verl_ext.gateway.responses import add_responses_route
from verl_ext.gateway.service import Gateway

# uvicorn closes an idle keep-alive connection after 5 s by default; a harness waiting longer than that between calls
# (a slow tool, a busy engine) can then send on a connection the server is closing and get a read error.
KEEP_ALIVE_S = 300
# The largest request body read (a 1,000-turn session's history is a few MB); a larger one is a 413.
MAX_BODY_BYTES = 64 * 1024 * 1024
log = logging.getLogger("verl_ext.gateway")


def create_app(gateway: Gateway, model_name: str) -> FastAPI:
    """The FastAPI app serving ``gateway``'s sessions under ``/sessions/{id}``."""
    app = FastAPI(title="verl_ext gateway")

    @app.exception_handler(GatewayError)
    async def gateway_error(request: Request, exc: GatewayError) -> JSONResponse:
        return _error_response(request, exc)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return _error_response(request, http_error_of(request, exc))

    @app.exception_handler(Exception)
    async def server_fault(request: Request, exc: Exception) -> JSONResponse:
        log.exception("the gateway failed serving %s %s", request.method, request.url.path)
        fault = GatewayError(
            500,
            f"the gateway failed: {type(exc).__name__}: {exc} (a fault of the server, not of the request: the "
            "session is as it was before it; the gateway's log has the traceback)",
            type="server_error",
            code="internal_error",
        )
        return _error_response(request, fault)

    @app.post("/sessions/{session_id}/v1/chat/completions")
    async def chat_completions(session_id: str, request: Request) -> Any:
        body = await _json_body(request)
        chat = parse_chat_request(body)
        done = await gateway.complete(session_id, chat)
        if chat.stream:
            events = stream_events(done, session_id, model_name, chat.include_usage, chat.legacy_functions)
            return StreamingResponse(events, media_type="text/event-stream", headers=done.overridden_header())
        body = completion_body(done, session_id, model_name, chat.legacy_functions)
        return JSONResponse(body, headers=done.overridden_header())

    add_messages_route(app, gateway, model_name, _json_body)
    add_responses_route(app, gateway, model_name, _json_body)

    @app.get("/sessions/{session_id}/v1/models")
    async def models(session_id: str) -> dict[str, Any]:
        gateway.session(session_id)  # 404 / 409 as for a completion
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "verl_ext"}]}

    @app.post("/sessions/{session_id}/open")
    async def open_session(session_id: str) -> dict[str, Any]:
        gateway.open(session_id)
        return {"session": session_id, "opened": True}

    @app.post("/sessions/{session_id}/end")
    async def end_session(session_id: str) -> dict[str, Any]:
        session = gateway.sessions.get(session_id)
        lock = session.lock if session is not None else asyncio.Lock()
        ended_before = gateway.ended.get(session_id) if session is None else None
        async with lock:  # a turn in flight finishes first
            results = gateway.end(session_id)
        answer: dict[str, Any] = {"session": session_id, "branches": [branch_summary(r) for r in results]}
        if ended_before is not None:  # ending twice is harmless, and said: its branches were recorded the first time
            answer["note"] = (
                f"session {session_id!r} had ended already ({ended_before}); nothing more was recorded (its branches "
                "were recorded when it ended): open a new session for a new rollout"
            )
        return answer

    return app


def branch_summary(result: BranchResult) -> dict[str, Any]:
    """What ``/end`` says of one branch: its check verdict, turns, tokens and fork."""
    check = result.result
    return {
        "branch": result.branch,
        "ok": check.ok,
        "engine_ok": check.engine_ok,
        "engine_failures": [f.detail for f in check.engine_failures],
        "findings": [f.cause.value for f in check.findings],
        "turns": check.num_turns,
        "sampled_tokens": check.num_sampled,
        "fork": result.rollout.extra.get("gateway", {}).get("fork"),
    }


def _error_response(request: Request, exc: GatewayError) -> JSONResponse:
    body = anthropic_error(exc) if is_messages_path(request.url.path) else exc.body()
    return JSONResponse(body, status_code=exc.status)


def http_error_of(request: Request, exc: HTTPException) -> GatewayError:
    """Starlette's routing errors (no such path, a method the path does not take) as the gateway's errors."""
    path, method = request.url.path, request.method
    if exc.status_code == 404:
        message = (
            f"no endpoint {path!r}: the gateway serves POST /sessions/{{id}}/v1/chat/completions, "
            "/sessions/{id}/v1/responses and /sessions/{id}/v1/messages, GET /sessions/{id}/v1/models, and POST "
            "/sessions/{id}/open and /sessions/{id}/end"
        )
        return GatewayError(404, message, type="not_found_error", code="unknown_url")
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("allow") or (exc.headers or {}).get("Allow") or "POST"
        return GatewayError(
            405,
            f"{method} is not served on {path!r}; use {allowed}",
            type="invalid_request_error",
            code="method_not_allowed",
        )
    return GatewayError(exc.status_code, str(exc.detail), type="invalid_request_error")


async def _json_body(request: Request) -> Any:
    raw = await _body(request)
    try:
        body = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise error_for_bad_json(f"byte {exc.start} is not UTF-8") from exc
    except json.JSONDecodeError as exc:
        raise error_for_bad_json(str(exc)) from exc
    except (ValueError, RecursionError) as exc:  # an integer of over 4,300 digits, nesting past Python's stack
        raise error_for_bad_json(f"{type(exc).__name__}: {exc}") from exc
    if b"\\ud" in raw or b"\\uD" in raw:  # a \uD800-\uDFFF escape: maybe a lone surrogate
        where = lone_surrogate(body)
        if where is not None:
            raise bad_request(
                where or None,
                f"{where or 'the body'} holds a lone UTF-16 surrogate (a \\uD800-\\uDFFF escape without its pair): "
                "it is no character, and no tokenizer can encode it; send valid Unicode",
                "invalid_unicode",
            )
    return body


async def _body(request: Request) -> bytes:
    """The request body, refused with a 413 past ``MAX_BODY_BYTES`` (read no further than that)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY_BYTES:
        raise too_large(int(length))
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large(size)
        chunks.append(chunk)
    return b"".join(chunks)


def too_large(size: int) -> GatewayError:
    """413 for a body over ``MAX_BODY_BYTES``."""
    return GatewayError(
        413,
        f"the request body is over {MAX_BODY_BYTES} bytes (at least {size}); the gateway reads at most that",
        type="invalid_request_error",
        code="request_too_large",
    )


def lone_surrogate(value: Any, where: str = "") -> str | None:
    """The path (``messages[2].content``; "" for the body itself) of the first string, key or value, holding a lone
    surrogate, or None."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return where
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            inner = f"{where}.{key}" if where else str(key)
            found = lone_surrogate(key, inner) if isinstance(key, str) else None
            found = found if found is not None else lone_surrogate(item, inner)
            if found is not None:
                return found
    elif isinstance(value, list):
        for k, item in enumerate(value):
            found = lone_surrogate(item, f"{where}[{k}]")
            if found is not None:
                return found
    return None


class ServerThread:
    """An app served by uvicorn in a daemon thread (``start`` returns once it accepts connections)."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        import uvicorn

        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, port))  # port 0: a free port, known before the server starts
        self.host, self.port = self.socket.getsockname()[:2]
        config = uvicorn.Config(app, log_level="warning", lifespan="off", timeout_keep_alive=KEEP_ALIVE_S)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)

    @property
    def url(self) -> str:
        """``http://host:port``."""
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> ServerThread:
        """Start serving; raises RuntimeError when the server is not up within ``timeout_s``."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the gateway server did not start on {self.url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Stop serving and wait for the thread."""
        self.server.should_exit = True
        self._thread.join(timeout=30)
        self.socket.close()
