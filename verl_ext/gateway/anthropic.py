"""The Anthropic Messages API per session: ``POST /sessions/{id}/v1/messages``, served by the same session core as
chat completions (``Gateway.complete``), so history matching, forks and the check are the same. A client of the
official SDK points ``base_url`` at ``http://HOST:PORT/sessions/{id}``.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from verl_ext.gateway.anthropic_request import parse_messages_request, stop_sequences_error
from verl_ext.gateway.anthropic_response import message_body, message_events
from verl_ext.gateway.errors import GatewayError
from verl_ext.gateway.service import Gateway

_MESSAGES_PATH = re.compile(r"^/sessions/[^/]+/v1/messages$")


def is_messages_path(path: str) -> bool:
    """Whether a request path is the Messages endpoint (its errors take Anthropic's shape)."""
    return bool(_MESSAGES_PATH.match(path))


def add_messages_route(
    app: FastAPI, gateway: Gateway, model_name: str, read_json: Callable[[Request], Awaitable[Any]]
) -> None:
    """Register ``POST /sessions/{id}/v1/messages`` on ``app`` (``read_json``: the server's body reader)."""

    @app.post("/sessions/{session_id}/v1/messages")
    async def messages(session_id: str, request: Request) -> Any:
        chat = parse_messages_request(await read_json(request))
        try:
            done = await gateway.complete(session_id, chat)
        except GatewayError as exc:
            renamed = stop_sequences_error(exc)
            if renamed is exc:
                raise
            raise renamed from exc
        # the stop sequences are single tokens (the gateway refused the request otherwise)
        stops = {gateway.renderer.encode(s)[0]: s for s in chat.stop}
        if chat.stream:
            events = message_events(done, session_id, model_name, stops)
            return StreamingResponse(events, media_type="text/event-stream", headers=done.overridden_header())
        return JSONResponse(message_body(done, session_id, model_name, stops), headers=done.overridden_header())
