"""A served turn in the Anthropic Messages API shape: a ``message`` body, or the server-sent events of a stream
(``message_start``, ``ping``, per content block ``content_block_start`` / ``content_block_delta`` /
``content_block_stop``, then ``message_delta`` and ``message_stop``), and errors as ``{"type": "error", "error":
{"type", "message"}}``, the shapes the official SDK reads.

Content blocks, in the order the turn has them: the sampled reasoning as a ``thinking`` block (its ``signature``
empty: nothing signs it), the text as a ``text`` block, each tool call as a ``tool_use`` block with its arguments
as ``input``. Extensions, as in the OpenAI shape: ``token_ids`` (the sampled ids, stop included) and ``verl_ext``
(session, branch, fork), top-level in a body and on the stream's ``message_delta`` event.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from verl_ext.gateway.errors import GatewayError
from verl_ext.gateway.service import Completion

_STOP_REASONS = {"tool_calls": "tool_use", "length": "max_tokens", "stop": "end_turn"}
# Anthropic's error types by HTTP status (the SDK raises its typed errors from the status; the type names it).
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


def stop_reason(done: Completion, stop_sequences: Mapping[int, str]) -> tuple[str, str | None]:
    """(``stop_reason``, ``stop_sequence``): ``stop_sequence`` with the string when the turn ended on the id of one
    of the request's stop sequences (``stop_sequences``: id -> string), else the turn's finish in Anthropic's terms."""
    last = done.token_ids[-1] if done.token_ids else None
    if done.finish_reason == "stop" and last in stop_sequences:
        return "stop_sequence", stop_sequences[last]
    return _STOP_REASONS[done.finish_reason], None


def content_blocks(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The assistant message as content blocks (an empty text is no block: the API refuses empty text blocks)."""
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"], "signature": ""})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or ():
        function = call["function"]
        blocks.append({"type": "tool_use", "id": call["id"], "name": function["name"], "input": _input(function)})
    return blocks


def _input(function: Mapping[str, Any]) -> Any:
    """The call's arguments as JSON, as the model wrote them (verl's parsers hand them over as JSON text)."""
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        return arguments
    try:
        return json.loads(arguments)
    except json.JSONDecodeError:
        return arguments  # not JSON: the text as sampled, for the client to judge (the session keeps it as is)


def _extension(done: Completion, session_id: str) -> dict[str, Any]:
    return {
        "session": session_id,
        "branch": done.branch,
        "fork": done.fork.to_json() if done.fork else None,
        "sampling_overridden": {k: dict(v) for k, v in done.sampling_overridden.items()},
    }


def message_body(done: Completion, session_id: str, model: str, stop_sequences: Mapping[int, str]) -> dict[str, Any]:
    """The non-streaming response body."""
    reason, sequence = stop_reason(done, stop_sequences)
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content_blocks(done.message),
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": {"input_tokens": done.prompt_tokens, "output_tokens": len(done.token_ids)},
        "token_ids": list(done.token_ids),
        "verl_ext": _extension(done, session_id),
    }


def _event(name: str, data: Mapping[str, Any]) -> str:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False)}\n\n"


def message_events(done: Completion, session_id: str, model: str, stop_sequences: Mapping[int, str]) -> Iterator[str]:
    """The streaming response, one content block after another. The turn is complete before the first event (the
    session's tokens are kept before anything is sent)."""
    reason, sequence = stop_reason(done, stop_sequences)
    start = {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": done.prompt_tokens, "output_tokens": 0},
    }
    yield _event("message_start", {"message": start})
    yield _event("ping", {})
    for index, block in enumerate(content_blocks(done.message)):
        kind = block["type"]
        if kind == "thinking":
            empty, delta = {**block, "thinking": ""}, {"type": "thinking_delta", "thinking": block["thinking"]}
        elif kind == "text":
            empty, delta = {**block, "text": ""}, {"type": "text_delta", "text": block["text"]}
        else:
            partial = json.dumps(block["input"], ensure_ascii=False)
            empty, delta = {**block, "input": {}}, {"type": "input_json_delta", "partial_json": partial}
        yield _event("content_block_start", {"index": index, "content_block": empty})
        yield _event("content_block_delta", {"index": index, "delta": delta})
        yield _event("content_block_stop", {"index": index})
    yield _event(
        "message_delta",
        {
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": {"output_tokens": len(done.token_ids)},
            "token_ids": list(done.token_ids),
            "verl_ext": _extension(done, session_id),
        },
    )
    yield _event("message_stop", {})


def anthropic_error(exc: GatewayError) -> dict[str, Any]:
    """The error body in Anthropic's shape; the gateway's own ``code`` and ``param`` under ``verl_ext``."""
    kind = _ERROR_TYPES.get(exc.status, "api_error" if exc.status >= 500 else "invalid_request_error")
    return {
        "type": "error",
        "error": {"type": kind, "message": exc.message},
        "verl_ext": {"code": exc.code, "param": exc.param},
    }
