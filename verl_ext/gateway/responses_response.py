"""A served turn in the OpenAI Responses API shape: a ``response`` body, or the server-sent events of a stream as
the openai SDK's Responses client reads them (``response.created``, ``response.in_progress``, per output item
``response.output_item.added`` / its deltas and ``.done`` events / ``response.output_item.done``, then
``response.completed``, or ``response.incomplete`` when the token budget cut the turn).

Output items, in the order the turn has them: the sampled reasoning as a ``reasoning`` item (its text as a
``reasoning_text`` part; nothing is encrypted or summarized), the text as an assistant ``message`` (one
``output_text`` part; left out when the turn only calls tools), each tool call as a ``function_call`` item whose
``call_id`` the client's ``function_call_output`` answers. Extensions, as in the chat shape: ``token_ids`` (the
sampled ids, stop included) and ``verl_ext`` (session, branch, fork, malformed calls), top-level in the response.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from verl_ext.gateway.request import ChatRequest
from verl_ext.gateway.service import Completion


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def output_items(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The assistant message as Responses output items (an empty text with calls is no message item)."""
    items: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        text = message["reasoning_content"]
        items.append({"type": "reasoning", "id": _id("rs"), "summary": [], "content": [_part("reasoning_text", text)]})
    calls = message.get("tool_calls") or ()
    if message.get("content") or not calls:
        items.append(
            {
                "type": "message",
                "id": _id("msg"),
                "role": "assistant",
                "status": "completed",
                "content": [{**_part("output_text", message.get("content") or ""), "annotations": [], "logprobs": []}],
            }
        )
    for call in calls:
        function = call["function"]
        arguments = function.get("arguments")
        items.append(
            {
                "type": "function_call",
                "id": _id("fc"),
                "call_id": call["id"],
                "name": function["name"],
                "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False),
                "status": "completed",
            }
        )
    return items


def _part(kind: str, text: str) -> dict[str, Any]:
    return {"type": kind, "text": text}


def response_body(
    done: Completion, session_id: str, model: str, request: ChatRequest, items: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """The non-streaming body (``items``: the output, when already built for a stream)."""
    output = output_items(done.message) if items is None else items
    incomplete = done.finish_reason == "length"
    return {
        **_envelope(model, request, "incomplete" if incomplete else "completed", done.sampling_overridden),
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "output": output,
        "usage": {
            "input_tokens": done.prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": len(done.token_ids),
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": done.prompt_tokens + len(done.token_ids),
        },
        "token_ids": list(done.token_ids),
        "verl_ext": {
            "session": session_id,
            "branch": done.branch,
            "fork": done.fork.to_json() if done.fork else None,
            "malformed_calls": done.malformed_calls,
            "sampling_overridden": {k: dict(v) for k, v in done.sampling_overridden.items()},
        },
    }


def _envelope(
    model: str, request: ChatRequest, status: str, overridden: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    return {
        "id": _id("resp"),
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": None,
        "model": model,
        "output": [],
        "parallel_tool_calls": True,
        # the values sampled with: training's where it overrode the request's (Completion.sampling_overridden)
        "temperature": overridden.get("temperature", {}).get("used", request.temperature),
        "top_p": overridden.get("top_p", {}).get("used", request.top_p),
        "max_output_tokens": request.max_tokens,
        "tool_choice": request.tool_choice,
        "tools": [{"type": "function", **t["function"]} for t in request.tools or ()],
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "text": {"format": {"type": "text"}},
        "truncation": "disabled",
        "store": False,
        "metadata": {},
    }


def response_events(done: Completion, session_id: str, model: str, request: ChatRequest) -> Iterator[str]:
    """The streaming response: the turn is complete before the first event (its tokens are kept first)."""
    items = output_items(done.message)
    body = response_body(done, session_id, model, request, items)
    start = {**body, "status": "in_progress", "output": [], "incomplete_details": None, "usage": None}
    sequence = iter(range(1 << 30))

    def event(kind: str, **data: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': next(sequence), **data})}\n\n"

    yield event("response.created", response=start)
    yield event("response.in_progress", response=start)
    for index, item in enumerate(items):
        yield from _item_events(event, index, item)
    yield event("response.incomplete" if body["status"] == "incomplete" else "response.completed", response=body)


def _item_events(event: Any, index: int, item: dict[str, Any]) -> Iterator[str]:
    at = {"item_id": item["id"], "output_index": index}
    if item["type"] == "function_call":
        yield event(
            "response.output_item.added", output_index=index, item={**item, "arguments": "", "status": "in_progress"}
        )
        yield event("response.function_call_arguments.delta", **at, delta=item["arguments"])
        yield event("response.function_call_arguments.done", **at, name=item["name"], arguments=item["arguments"])
    elif item["type"] == "reasoning":
        yield event("response.output_item.added", output_index=index, item={**item, "content": []})
        text = item["content"][0]["text"]
        yield event("response.reasoning_text.delta", **at, content_index=0, delta=text)
        yield event("response.reasoning_text.done", **at, content_index=0, text=text)
    else:
        part = item["content"][0]
        yield event(
            "response.output_item.added", output_index=index, item={**item, "content": [], "status": "in_progress"}
        )
        yield event("response.content_part.added", **at, content_index=0, part={**part, "text": ""})
        yield event("response.output_text.delta", **at, content_index=0, delta=part["text"], logprobs=[])
        yield event("response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[])
        yield event("response.content_part.done", **at, content_index=0, part=part)
    yield event("response.output_item.done", output_index=index, item=item)
