"""A served turn in the OpenAI shape: a ``chat.completion`` body, or the ``chat.completion.chunk`` events of a
stream (server-sent events ending in ``data: [DONE]``, as the OpenAI SDK reads them).

Extensions, in the places SGLang's and vLLM's servers use: ``choices[0].token_ids`` (the sampled ids, stop
included) and ``verl_ext`` (the session, the branch, the fork the request started, if any, the tool-call blocks
the parser could not read, and ``sampling_overridden``: each sampling setting of the request that training decided
otherwise, ``{"temperature": {"requested": 0.2, "used": 1.0}}``, also said in the
``X-Verl-Ext-Sampling-Overridden`` header on every route).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

from verl_ext.gateway.service import Completion


def _usage(done: Completion) -> dict[str, int]:
    completion = len(done.token_ids)
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": done.prompt_tokens + completion,
    }


def _extension(done: Completion, session_id: str) -> dict[str, Any]:
    return {
        "session": session_id,
        "branch": done.branch,
        "fork": done.fork.to_json() if done.fork else None,
        "malformed_calls": done.malformed_calls,
        "sampling_overridden": {k: dict(v) for k, v in done.sampling_overridden.items()},
    }


def legacy_call(message: dict[str, Any]) -> dict[str, Any] | None:
    """The turn's first tool call as the legacy API's ``function_call`` (a request that sent ``functions``); the
    gateway's id for it is the one the ``function_call`` is matched by when the client sends it back."""
    calls = message.get("tool_calls")
    return dict(calls[0]["function"]) if calls else None


def _finish(done: Completion, legacy: bool) -> str:
    return "function_call" if legacy and done.finish_reason == "tool_calls" else done.finish_reason


def completion_body(done: Completion, session_id: str, model: str, legacy: bool = False) -> dict[str, Any]:
    """The non-streaming response body (``legacy``: the request sent ``functions``, the answer has
    ``function_call`` and ``finish_reason: "function_call"``; ``tool_calls`` holds every call the model wrote)."""
    message = dict(done.message)
    if message.get("tool_calls") and not message.get("content"):
        message["content"] = None  # as OpenAI answers a turn that only calls tools
    if legacy and message.get("tool_calls"):
        message["function_call"] = legacy_call(message)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": _finish(done, legacy),
                "logprobs": None,
                "token_ids": list(done.token_ids),
            }
        ],
        "usage": _usage(done),
        "verl_ext": _extension(done, session_id),
    }


def stream_events(
    done: Completion, session_id: str, model: str, include_usage: bool, legacy: bool = False
) -> Iterator[str]:
    """The streaming response: server-sent events, one chunk per part of the message, then the finish, the usage
    (when asked for) and ``[DONE]``. The turn is complete before the first event (the session's tokens are kept
    before anything is sent)."""
    base = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
    }

    def event(delta: dict[str, Any], finish: str | None = None, **choice: Any) -> str:
        chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None, **choice}]}
        return f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"

    message = done.message
    yield event({"role": "assistant", "content": ""})
    if message.get("reasoning_content"):
        yield event({"reasoning_content": message["reasoning_content"]})
    if message.get("content"):
        yield event({"content": message["content"]})
    for k, call in enumerate(message.get("tool_calls") or ()):
        yield event({"tool_calls": [{"index": k, **call}]})
    if legacy and message.get("tool_calls"):
        yield event({"function_call": legacy_call(message)})
    yield event({}, _finish(done, legacy), token_ids=list(done.token_ids))
    if include_usage:
        usage = {**base, "choices": [], "usage": _usage(done), "verl_ext": _extension(done, session_id)}
        yield f"data: {json.dumps(usage)}\n\n"
    yield "data: [DONE]\n\n"
