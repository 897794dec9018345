"""History matching: which part of a request's messages a session already holds, and where it departs.

Each message is reduced to a key (role, text, tool calls with their arguments as parsed JSON, tool-call id,
name); reasoning is not part of the key, because harnesses drop it (a request that sends reasoning is compared
with what the engine sampled separately). Keys are chained into digests: ``digests[n]`` is the digest of the
first n messages, so a request is matched by hashing each of its messages once and looking each running digest
up in the session's index; the cost is reading the request, whatever the length of the session's history.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.gateway.images import content_key

ROOT = b"\x00" * 16  # the digest of no messages


def canonical_arguments(arguments: Any) -> str:
    """Tool-call arguments as canonical JSON (sorted keys, no spaces) when they parse, else the text as sent:
    ``{"a": 1}`` and ``{"a":1}`` have the same canonical form."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _field(text: str | None) -> str:
    """One field of a key, length-prefixed, so that no two different messages share a key (``None`` differs from
    "")."""
    return "-" if text is None else f"{len(text)}:{text}"


def message_key(message: Mapping[str, Any]) -> bytes:
    """The bytes a message is matched by (a normalized message: ``verl_ext.gateway.request``); no reasoning.
    Length-prefixed fields rather than JSON: a key is built for every message of every request."""
    parts = [_field(message["role"]), _field(content_key(message.get("content")))]
    for call in message.get("tool_calls") or ():
        function = call["function"]
        parts += [
            "c",
            _field(call["id"]),
            _field(function["name"]),
            _field(canonical_arguments(function.get("arguments"))),
        ]
    parts += ["|", _field(message.get("tool_call_id")), _field(message.get("name"))]
    return "".join(parts).encode("utf-8")


def tools_key(tools: Sequence[Mapping[str, Any]] | None) -> bytes:
    """The bytes a request's tools are matched by: part of every digest, since the first prompt renders them."""
    return json.dumps(list(tools or ()), ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def chain(previous: bytes, key: bytes) -> bytes:
    """The digest of a history extended by one message's key."""
    return hashlib.blake2b(previous + key, digest_size=16).digest()


@dataclass(frozen=True)
class Divergence:
    """Where a request departs from a branch of the session: the message index and the field that differed
    (``"missing"`` when the request ends before the branch does)."""

    index: int
    field: str
    detail: str

    def to_json(self) -> dict[str, Any]:
        """JSON-ready, for records and responses."""
        return {"message": self.index, "field": self.field, "detail": self.detail}


def divergence(request: Sequence[Mapping[str, Any]], held: Sequence[Mapping[str, Any]], index: int) -> Divergence:
    """Name the first field of ``request[index]`` that differs from ``held[index]``: ``role``, ``content``,
    ``tool_calls`` (their number), ``tool_calls[k].id`` / ``.function.name`` / ``.function.arguments``,
    ``tool_call_id``, ``name`` or ``reasoning_content``; ``missing`` when the request has no message there."""
    if index >= len(request):
        return Divergence(
            index, "missing", f"the request ends after {len(request)} messages; the session's branch holds {len(held)}"
        )
    if index >= len(held):
        return Divergence(index, "extra", f"messages[{index}] is a {request[index]['role']} message after the branch")
    new, old = request[index], held[index]
    if new["role"] != old["role"]:
        return Divergence(index, "role", f"role: {_short(old['role'])} -> {_short(new['role'])}")
    new_content, old_content = content_key(new.get("content")), content_key(old.get("content"))
    if new_content != old_content:  # images by their digests
        return Divergence(index, "content", f"content: {_short(old_content)} -> {_short(new_content)}")
    new_calls, old_calls = new.get("tool_calls") or [], old.get("tool_calls") or []
    if len(new_calls) != len(old_calls):
        return Divergence(index, "tool_calls", f"{len(old_calls)} tool calls -> {len(new_calls)}")
    for k, (a, b) in enumerate(zip(new_calls, old_calls, strict=True)):
        pairs = (
            ("id", a["id"], b["id"]),
            ("function.name", a["function"]["name"], b["function"]["name"]),
            (
                "function.arguments",
                canonical_arguments(a["function"].get("arguments")),
                canonical_arguments(b["function"].get("arguments")),
            ),
        )
        for name, x, y in pairs:
            if x != y:
                return Divergence(index, f"tool_calls[{k}].{name}", f"{_short(y)} -> {_short(x)}")
    for name in ("tool_call_id", "name"):
        if new.get(name) != old.get(name):
            return Divergence(index, name, f"{_short(old.get(name))} -> {_short(new.get(name))}")
    return Divergence(index, "reasoning_content", "the reasoning sent back differs from what the engine sampled")


def reasoning_differs(request: Mapping[str, Any], held: Mapping[str, Any]) -> bool:
    """Whether a request's assistant message sends reasoning other than what the engine sampled (sending none,
    or an empty one, matches: harnesses drop it, and the stream keeps what was sampled)."""
    sent = request.get("reasoning_content")
    return bool(sent) and sent.strip() != (held.get("reasoning_content") or "").strip()


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
