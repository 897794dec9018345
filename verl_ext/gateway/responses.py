"""The OpenAI Responses API per session: ``POST /sessions/{id}/v1/responses``, served by the same session core as
chat completions (``Gateway.complete``), so history matching, forks and the check are the same. A client of the
official SDK points ``base_url`` at ``http://HOST:PORT/sessions/{id}/v1``, as for chat completions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from verl_ext.gateway.responses_request import parse_responses_request
from verl_ext.gateway.responses_response import response_body, response_events
from verl_ext.gateway.service import Gateway


def add_responses_route(
    app: FastAPI, gateway: Gateway, model_name: str, read_json: Callable[[Request], Awaitable[Any]]
) -> None:
    """Register ``POST /sessions/{id}/v1/responses`` on ``app`` (``read_json``: the server's body reader)."""

    @app.post("/sessions/{session_id}/v1/responses")
    async def responses(session_id: str, request: Request) -> Any:
        chat = parse_responses_request(await read_json(request))
        done = await gateway.complete(session_id, chat)
        if chat.stream:
            events = response_events(done, session_id, model_name, chat)
            return StreamingResponse(events, media_type="text/event-stream", headers=done.overridden_header())
        return JSONResponse(response_body(done, session_id, model_name, chat), headers=done.overridden_header())
