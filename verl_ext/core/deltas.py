"""The tokens a template renders after an assistant turn: close, boundary trailer, new messages.

Computed at token level against a synthetic history (a marker user turn and an assistant turn with
the real tool calls), so the real history is never re-rendered and never re-tokenized.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from verl_ext.core.appended_text import refuse_dropped_content
from verl_ext.core.errors import TemplateError
from verl_ext.core.rendering import ChatRenderer, Escape, Message
from verl_ext.core.template_profile import TemplateProfile

_SYNTHETIC_SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
_SYNTHETIC_USER = {"role": "user", "content": "Hello."}


class History(NamedTuple):
    """What of the real history the synthetic one a delta is rendered after mirrors."""

    with_system: bool  # the conversation opens with a system message
    earlier_tool_round: bool = False  # a tool round came before the turn (only where the template keeps state)


def _history(with_system: bool | History) -> History:
    return with_system if isinstance(with_system, History) else History(bool(with_system))


def _head(history: History, previous: Message | None) -> list[Message]:
    """The synthetic messages before the turn: a system prompt where the real one has one, a user message, and one
    tool round (a call to the previous turn's first tool, and its result) where the template carries state over."""
    head: list[Message] = [_SYNTHETIC_SYSTEM, _SYNTHETIC_USER] if history.with_system else [_SYNTHETIC_USER]
    if history.earlier_tool_round:
        calls = (previous or {}).get("tool_calls") or []
        name = _call_name(calls[0]) if calls else "tool"
        call = {"id": "call99999", "type": "function", "function": {"name": name or "tool", "arguments": {}}}
        head += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": _SYNTHETIC_REPLY, "tool_call_id": "call99999", "name": name or "tool"},
        ]
    return head


@dataclass(frozen=True)
class ContextDelta:
    """What follows the assistant's body when ``messages`` are appended, split by origin."""

    close_ids: tuple[int, ...]  # the template's close of the assistant turn (empty: none)
    trailer_ids: tuple[int, ...]  # rendered after the close, never generated
    context_ids: tuple[int, ...]  # the new messages and the generation prompt
    escapes: tuple[Escape, ...]
    escape_divergence: str = ""  # where the escaped render's text is not the template's (see Rendered)

    @property
    def boundary_ids(self) -> tuple[int, ...]:
        """Every id the delta appends: close, trailer, then the context."""
        return self.close_ids + self.trailer_ids + self.context_ids


def render_context_delta(
    renderer: ChatRenderer,
    profile: TemplateProfile,
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]] | None,
    previous_assistant: Message | None,
    with_system: bool | History,
) -> ContextDelta:
    """Token delta for appending ``messages`` right after an assistant turn, generation prompt included."""
    with_system = _history(with_system)
    if not messages:
        raise TemplateError("append_messages needs at least one message")
    assistant = _synthetic_assistant(messages, previous_assistant)
    refuse_beyond_template_limit(profile, assistant, messages)
    per_call = _results_per_call(profile, messages, assistant)
    together = _delta(renderer, profile, messages, tools, assistant, with_system, add_generation_prompt=True)
    if per_call is None:
        return together
    # Each result rendered after an assistant turn holding only its own call, so a template that labels results
    # with "the last call's" name (GPT-OSS: <|start|>functions.NAME) labels each with its own; then joined.
    pieces = [
        _delta(renderer, profile, [result], tools, call_turn, with_system, add_generation_prompt=k == len(per_call) - 1)
        for k, (call_turn, result) in enumerate(per_call)
    ]
    escapes = tuple(
        dataclasses.replace(e, message_index=e.message_index + k) for k, p in enumerate(pieces) for e in p.escapes
    )
    divergence = "; ".join(p.escape_divergence for p in pieces if p.escape_divergence)
    context = tuple(i for p in pieces for i in p.context_ids)
    names = [_call_name(call_turn["tool_calls"][0]) for call_turn, _ in per_call]
    if not _only_labels_differ(renderer.decode(list(together.context_ids)), renderer.decode(list(context)), names):
        # The pieces differ from the template's own render beyond the labels: it writes its results as one block
        # (DeepSeek R1: one outputs block, "\n" between results) or writes a generation prompt after each piece
        # (firefunction writes it whatever add_generation_prompt says). The template's render is what it writes.
        return together
    return ContextDelta(pieces[0].close_ids, pieces[0].trailer_ids, context, escapes, divergence)


def _only_labels_differ(together: str, joined: str, names: Sequence[str]) -> bool:
    """The results rendered together and one call at a time differ at most in which call's name labels a result."""
    for name in sorted({n for n in names if n}, key=len, reverse=True):
        together, joined = together.replace(name, "\x00"), joined.replace(name, "\x00")
    return together == joined


def _delta(
    renderer: ChatRenderer,
    profile: TemplateProfile,
    messages: Sequence[Message],
    tools: Sequence[Mapping[str, Any]] | None,
    assistant: Message,
    history: History,
    add_generation_prompt: bool,
) -> ContextDelta:
    role = str(messages[0].get("role"))
    boundary = profile.boundary(role)
    marker = boundary.boundary_id
    if marker is None:
        raise TemplateError(f"the probe found no boundary token before a {role!r} message")
    head = _head(history, assistant)
    head_render = renderer.render(
        profile.tool_call_shape.conform(head), tools, add_generation_prompt=True, escape=False
    )
    prompt = head_render.ids
    conversation = profile.tool_call_shape.conform([*head, assistant, *messages])
    full = renderer.render(conversation, tools, add_generation_prompt=add_generation_prompt)
    # The assistant's boundary token is the first one after those the prompt already holds. Counting
    # (rather than requiring a token prefix) tolerates templates that move the system or tool list.
    if boundary.close_omitted:
        return _delta_after_unclosed_call(
            renderer, boundary, head_render.text, conversation, tools, full, messages, add_generation_prompt
        )
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
    context = tuple(rest[len(trailer) :])
    refuse_dropped_content(
        renderer,
        conversation,
        len(messages),
        tools,
        add_generation_prompt,
        renderer.decode([marker]),
        head_render.text,
        full.text,
    )
    return ContextDelta(tuple(close), tuple(trailer), context, escapes, full.escape_divergence)


def _delta_after_unclosed_call(
    renderer: ChatRenderer,
    boundary: Any,
    head_text: str,
    conversation: Sequence[Message],
    tools: Sequence[Mapping[str, Any]] | None,
    full: Any,
    messages: Sequence[Message],
    add_generation_prompt: bool,
) -> ContextDelta:
    """The delta after a tool-call turn the template renders without a close (``Boundary.close_omitted``): what
    follows the turn's own render. The close is the engine's where it sampled one; none is added where the template
    writes none."""
    n_before = len(conversation) - len(messages)
    bare = renderer.render(conversation[:n_before], tools, add_generation_prompt=False, escape=False)
    if tuple(full.ids[: len(bare.ids)]) != tuple(bare.ids) or not bare.ids:
        raise TemplateError(
            f"the template writes no close after a single tool call, and the turn's render is not where "
            f"{[m.get('role') for m in messages]} starts; run `verl-ext check-template` on this tokenizer"
        )
    offset = n_before
    escapes = tuple(dataclasses.replace(e, message_index=e.message_index - offset) for e in full.escapes)
    refuse_dropped_content(
        renderer,
        conversation,
        len(messages),
        tools,
        add_generation_prompt,
        renderer.decode([bare.ids[-1]]),
        head_text,
        full.text,
    )
    context = tuple(full.ids[len(bare.ids) :])
    # The template's own continuation: where it ends the turn without the close (a single call), none is inserted
    # (a close the engine sampled stays, as sampled); where it writes one (several calls), a turn without it gets it.
    close = tuple(boundary.close_ids) if bare.ids[-1] in boundary.close_ids else ()
    return ContextDelta(close, (), context, escapes, full.escape_divergence)


def renders_per_call(profile: TemplateProfile, messages: Sequence[Message], assistant: Message) -> bool:
    """Whether ``render_context_delta`` may render these tool results one call at a time (see ``_results_per_call``;
    it does where that differs from the template's own render only in the labels).
    ``assistant`` is the synthetic turn they follow (``synthetic_history(messages, previous, ...)[1]``), built once
    by the caller, which also needs it for ``refuse_beyond_template_limit``."""
    return _results_per_call(profile, messages, assistant) is not None


def _results_per_call(
    profile: TemplateProfile, messages: Sequence[Message], assistant: Message
) -> list[tuple[dict[str, Any], Message]] | None:
    """(assistant turn with one call, its result) per tool result, when results must be rendered one by one: the
    turn made calls to several tools, only tool results follow, and the template renders each result as its own
    message (results it groups into one turn are rendered together, as the template does)."""
    if len(messages) < 2 or profile.consecutive_tool_results_grouped is not False:
        return None  # (the common case, one result per turn, decided before any call is looked at)
    calls = list(assistant.get("tool_calls") or [])
    if len(calls) < 2 or len({_call_name(c) for c in calls}) < 2:
        return None
    if any(m.get("role") != "tool" for m in messages):
        return None
    by_id = {c.get("id"): c for c in calls if isinstance(c, Mapping) and c.get("id")}
    out = []
    for k, result in enumerate(messages):
        call = by_id.get(result.get("tool_call_id")) or (calls[k] if k < len(calls) else None)
        if call is None:
            return None
        out.append(({**assistant, "tool_calls": [call]}, result))
    return out


def _call_name(call: Any) -> str:
    function = call.get("function") if isinstance(call, Mapping) else None
    return str((function or call).get("name", "")) if isinstance(function or call, Mapping) else ""


def refuse_beyond_template_limit(profile: TemplateProfile, assistant: Message, messages: Sequence[Message]) -> None:
    """Refuse, before rendering, a turn shape the probe found the template cannot render (several tool calls in
    one turn on a single-call template), naming the template's limit and the fix."""
    calls = assistant.get("tool_calls") or []
    if len(calls) > 1 and profile.parallel_tool_calls is False:
        said = f" (the template says: {profile.parallel_tool_calls_error})" if profile.parallel_tool_calls_error else ""
        raise TemplateError(
            f"this chat template renders at most one tool call per assistant turn{said}; the turn before "
            f"{[m.get('role') for m in messages]} has {len(calls)}. Let the loop run one call per turn (verl: "
            "actor_rollout_ref.rollout.multi_turn.max_parallel_calls=1)"
        )


def synthetic_history(
    messages: Sequence[Message], previous_assistant: Message | None, with_system: bool | History
) -> tuple[list[Message], dict[str, Any]]:
    """The short history a delta is rendered after: a synthetic prompt, then a synthetic assistant turn."""
    assistant = _synthetic_assistant(messages, previous_assistant)
    return _head(_history(with_system), assistant), assistant


def _nth_index(ids: Sequence[int], value: int, n: int) -> int | None:
    seen = 0
    for i, token in enumerate(ids):
        if token == value:
            if seen == n:
                return i
            seen += 1
    return None


_SYNTHETIC_REPLY = "OK."


def _synthetic_assistant(messages: Sequence[Message], previous: Message | None) -> dict[str, Any]:
    """An assistant turn: tool calls from the real turn, or made from the tool results, with no text; otherwise a
    short text, as a real turn has (a template may render a text turn with empty content without its close:
    Seed-OSS writes no <seed:eos> then, and the boundary token found would be the appended message's own)."""
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
    assistant: dict[str, Any] = {"role": "assistant", "content": "" if tool_calls else _SYNTHETIC_REPLY}
    if tool_calls:
        assistant["tool_calls"] = tool_calls
    return assistant
