"""The tokens a template renders after an assistant turn: close, boundary trailer, new messages.

Computed at token level against a synthetic history (a marker user turn and an assistant turn with
the real tool calls), so the real history is never re-rendered and never re-tokenized.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.core.errors import TemplateError
from verl_ext.core.probe import TemplateProfile
from verl_ext.core.rendering import ChatRenderer, Escape, Message

_SYNTHETIC_SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
_SYNTHETIC_USER = {"role": "user", "content": "Hello."}


@dataclass(frozen=True)
class ContextDelta:
    """What follows the assistant's body when ``messages`` are appended, split by origin."""

    close_ids: tuple[int, ...]  # the template's close of the assistant turn (empty: none)
    trailer_ids: tuple[int, ...]  # rendered after the close, never generated
    context_ids: tuple[int, ...]  # the new messages and the generation prompt
    escapes: tuple[Escape, ...]

    @property
    def boundary_ids(self) -> tuple[int, ...]:
        return self.close_ids + self.trailer_ids + self.context_ids


def render_context_delta(
    renderer: ChatRenderer,
    profile: TemplateProfile,
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]] | None,
    previous_assistant: Message | None,
    with_system: bool,
) -> ContextDelta:
    """Token delta for appending ``messages`` right after an assistant turn, generation prompt included."""
    if not messages:
        raise TemplateError("append_messages needs at least one message")
    role = str(messages[0].get("role"))
    boundary = profile.boundary(role)
    marker = boundary.boundary_id
    if marker is None:
        raise TemplateError(f"the probe found no boundary token before a {role!r} message")
    head, assistant = synthetic_history(messages, previous_assistant, with_system)
    prompt = renderer.render(head, tools, add_generation_prompt=True, escape=False).ids
    full = renderer.render([*head, assistant, *messages], tools, add_generation_prompt=True)
    # The assistant's boundary token is the first one after those the prompt already holds. Counting
    # (rather than requiring a token prefix) tolerates templates that move the system or tool list.
    seen = prompt.count(marker)
    at = _nth_index(full.ids, marker, seen)
    if at is None:
        raise TemplateError(
            f"could not find the assistant turn's boundary token {renderer.decode([marker])!r} when appending "
            f"{[m.get('role') for m in messages]}; run `verl-ext check-template` on this tokenizer"
        )
    rest = full.ids[at:]
    close = rest[: len(boundary.close_ids)]
    rest = rest[len(close) :]
    trailer = boundary.trailer_ids if rest[: len(boundary.trailer_ids)] == boundary.trailer_ids else ()
    # Number escapes by their position among the appended messages, not the synthetic history.
    offset = len(head) + 1
    escapes = tuple(dataclasses.replace(e, message_index=e.message_index - offset) for e in full.escapes)
    return ContextDelta(tuple(close), tuple(trailer), tuple(rest[len(trailer) :]), escapes)


def synthetic_history(
    messages: Sequence[Message], previous_assistant: Message | None, with_system: bool
) -> tuple[list[Message], dict[str, Any]]:
    """The short history a delta is rendered after: a synthetic prompt, then an assistant turn with no text."""
    head: list[Message] = [_SYNTHETIC_SYSTEM, _SYNTHETIC_USER] if with_system else [_SYNTHETIC_USER]
    return head, _synthetic_assistant(messages, previous_assistant)


def _nth_index(ids: Sequence[int], value: int, n: int) -> int | None:
    seen = 0
    for i, token in enumerate(ids):
        if token == value:
            if seen == n:
                return i
            seen += 1
    return None


def _synthetic_assistant(messages: Sequence[Message], previous: Message | None) -> dict[str, Any]:
    """An assistant turn with no text; tool calls from the real turn, or made from the tool results."""
    tool_calls: list[Any] = []
    if previous is not None and previous.get("tool_calls"):
        tool_calls = list(previous["tool_calls"])
    elif messages[0].get("role") == "tool":
        for n, m in enumerate(x for x in messages if x.get("role") == "tool"):
            tool_calls.append(
                {
                    "id": m.get("tool_call_id") or f"call{n:05d}",
                    "type": "function",
                    "function": {"name": m.get("name") or "tool", "arguments": {}},
                }
            )
    assistant: dict[str, Any] = {"role": "assistant", "content": ""}
    if tool_calls:
        assistant["tool_calls"] = tool_calls
    return assistant
