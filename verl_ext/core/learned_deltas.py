"""Context deltas from pieces learned once per message shape: per turn, only the new content is encoded.

``render_context_delta`` renders two synthetic conversations per append (Jinja, and the tool schema encoded twice).
For messages of the same *shape* (their roles, the other fields the template prints, the previous turn's tool
names, the tools and the system-prompt layout) the template renders the same text around each message's content,
so that text is learned once, as fixed pieces around content slots. A string field the template prints and that
changes every turn (Mistral's ``tool_call_id``) is a slot too, learned per value length. Each turn then builds
``piece0 + content0 + piece1 + ... + pieceN`` and encodes it in one call: BPE merges across a content's edges come
out exactly as in a render, and the text starts at an added token, where tokenizers split their input, so its
tokens are the render's tokens. Nothing per turn depends on the length of the stream or of the conversation.

Soundness, never assumed:
- a shape is learned from a marker render, and must reproduce a render of tricky contents (edge whitespace,
  quotes, backslashes, newlines, non-ASCII), which picks the content transform the template applies (verbatim,
  trimmed or JSON-quoted);
- it is verified against the real render on first use, and again on a sampled ``verify_rate`` of later uses;
- a shape that cannot be learned or verified, and a turn with non-string content, use the render; the result names
  why (``DeltaResult.rendered_because``) and the trajectory writes that into its edit log. Content with special-token
  text that must stay text is rendered too (its escapes, and any escape divergence, are logged), and so are tool
  results that ``render_context_delta`` renders one call at a time. A learned delta never silently differs from
  the render.
"""

from __future__ import annotations

import functools
import json
import random
import re
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.core.deltas import (
    ContextDelta,
    History,
    refuse_beyond_template_limit,
    render_context_delta,
    renders_per_call,
    synthetic_history,
)
from verl_ext.core.errors import OptionsError, TemplateError
from verl_ext.core.rendering import ChatRenderer, Message
from verl_ext.core.template_profile import TemplateProfile

DEFAULT_VERIFY_RATE = 1 / 64  # share of learned-path appends re-checked against a render (first use: always)
_MAX_SHAPES = 4096
_MAX_VARIANTS = 8

# Content transforms templates apply, tried in this order against the tricky render.
_TRANSFORMS: dict[str, Callable[[str], str]] = {
    "verbatim": lambda s: s,
    "trimmed": str.strip,  # jinja's |trim
    # transformers' |tojson: json.dumps(s, ensure_ascii=False), with the encoder built once, not per turn
    "json": json.JSONEncoder(ensure_ascii=False).encode,
}
_MARKER = "QXSLOT{}QX"
_TRICKY = '  QXTRICKY{} "q" \\ \u00e9\u4e2d {{x}} <b>&amp;\t\n 1\n\n'
_ALTERED = "QXFIELD{}QX"
# A string field the template prints (Mistral's tool_call_id) is a slot like content when its value is at least this
# long and plain (letters, digits, "_-.:": nothing a template would quote or escape, no special-token text): learned
# with a marker of the value's own length (templates check lengths: Mistral requires 9 characters), keyed by that
# length, printed verbatim. Other values stay in the key.
_MIN_FIELD_SLOT = 4
_PLAIN_FIELD = re.compile(r"[A-Za-z0-9_.:-]+")


def _field_marker(j: int, n: int) -> str:
    return (f"QF{j}" + "Z" * n)[:n]


def _field_alternative(j: int, n: int) -> str:
    return (f"Rk{j}" + "m7Pq2" * n)[:n]


@dataclass(frozen=True)
class DeltaResult:
    """A context delta and, when it came from a render instead of the learned pieces, why."""

    delta: ContextDelta
    rendered_because: str | None = None  # why the learned pieces were not used (None: learned, or first use)


@dataclass
class _Shape:
    close_ids: tuple[int, ...]
    trailer_ids: tuple[int, ...]
    pieces: tuple[str, ...]  # len(pieces) == len(slots) + 1
    transform: Callable[[str], str]  # applied to contents, not to fields
    slots: tuple[tuple[int, str], ...]  # in text order: (message index, "content" or the printed field's name)
    uses: int = 0

    @functools.cached_property
    def lead_ids(self) -> tuple[int, ...]:
        """What each filled delta's ids must start with (joined once per shape, not per turn)."""
        return self.close_ids + self.trailer_ids


@dataclass
class DeltaStats:
    """How the appends of a process were built: from learned pieces, from renders, verified."""

    learned: int = 0  # appends built from learned pieces
    rendered: int = 0  # appends taken from a render (first uses, fallbacks)
    verified: int = 0  # learned appends also rendered and compared
    shapes: int = 0
    unverifiable: int = 0


class LearnedDeltas:
    """Learns and serves context deltas for one renderer and profile (share one per template across rollouts)."""

    def __init__(
        self,
        renderer: ChatRenderer,
        profile: TemplateProfile,
        *,
        verify_rate: float = DEFAULT_VERIFY_RATE,
        seed: int = 0,
        enabled: bool = True,
    ) -> None:
        if not 0.0 <= verify_rate <= 1.0:
            raise OptionsError(f"verify_rate must be within [0, 1], got {verify_rate!r}")
        self.renderer = renderer
        self.profile = profile
        self.verify_rate = verify_rate
        self.enabled = enabled
        self.stats = DeltaStats()
        self._rng = random.Random(seed)
        self._shapes: OrderedDict[tuple[Any, ...], _Shape | str] = OrderedDict()  # str: why it is not learnable
        self._variants: dict[tuple[Any, ...], int] = {}  # shapes learned per key without field values
        self._relevant: dict[tuple[Any, ...], tuple[tuple[int, str], ...]] = {}  # fields the template prints
        self._no_slots: set[tuple[Any, ...]] = set()  # keys without field values whose fields cannot be slots

    # -- the per-turn call --------------------------------------------------------------------------
    def context_delta(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None,
        previous_assistant: Message | None,
        with_system: bool,
        tools_key: str | None = None,
        earlier_tool_round: bool = False,
    ) -> DeltaResult:
        """The delta for appending ``messages`` after an assistant turn (generation prompt included);
        ``earlier_tool_round``: the conversation holds a tool round before that turn."""
        history = History(with_system, earlier_tool_round and self.profile.tool_rounds_share_state)

        def render() -> ContextDelta:
            self.stats.rendered += 1
            return render_context_delta(self.renderer, self.profile, messages, tools, previous_assistant, history)

        if not self.enabled:
            return DeltaResult(render())
        # Checked every turn, not only when a shape is learned: the learned path never renders. The synthetic turn
        # is built once per turn, for this refusal and for ``renders_per_call``.
        assistant = synthetic_history(messages, previous_assistant, False)[1]
        refuse_beyond_template_limit(self.profile, assistant, messages)
        why = self._must_render(messages, assistant)
        if why is not None:
            return DeltaResult(render(), why or None)
        if tools_key is None:
            tools_key = tools_fingerprint(tools)
        key, shape = self._shape_for(messages, tools, previous_assistant, history, tools_key)
        if isinstance(shape, str):
            return DeltaResult(render(), shape)
        delta = self._fill(shape, messages)
        if isinstance(delta, str):
            return DeltaResult(render(), delta)
        return self._served(key, shape, delta, messages, render)

    def _must_render(self, messages: Sequence[Message], assistant: Message) -> str | None:
        """None when a learned shape may serve ``messages`` (appended after the synthetic turn ``assistant``); else
        why they are rendered ("": no reason worth reporting, the edit log records the escapes)."""
        for n, m in enumerate(messages):
            content = m.get("content")
            if not isinstance(content, str):
                return f"message {n} has non-string content: rendered"
            if self.renderer.escapes_text(str(m.get("role")), content):
                return ""  # rendered for its escapes, which the edit log records one by one (escaped_special)
        if renders_per_call(self.profile, messages, assistant):
            # Results of calls to several tools are rendered one call at a time where the template labels them
            # (each with its own call, GPT-OSS), which one learned render of the whole list would not reproduce.
            return (
                f"results of {len(messages)} calls to several tools, labelled one call at a time where the template "
                "labels them: rendered"
            )
        return None

    def _shape_for(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None,
        previous_assistant: Message | None,
        history: History,
        tools_key: str,
    ) -> tuple[tuple[Any, ...], _Shape | str]:
        """(the shape's key, the learned shape or why it is rendered), learning it on first sight."""
        base, slots, key = self._key(messages, tools, previous_assistant, history, tools_key)
        shape = self._shapes.get(key)
        if shape is not None:
            self._shapes.move_to_end(key)
            return key, shape
        self._variants[base] = self._variants.get(base, 0) + 1
        if self._variants[base] > _MAX_VARIANTS:
            # The template prints a field that changes every turn and cannot be a slot: learning each value
            # would cost more than rendering.
            fields = [f"{messages[i].get('role')}.{k}" for i, k in self._relevant[base]]
            return key, f"the template prints {fields}, which change every turn: rendered"
        shape = self._learn(messages, tools, previous_assistant, history, slots)
        if isinstance(shape, str) and slots:
            # The printed fields are not plain slots (printed twice, cut, transformed): key by their values.
            self._no_slots.add(base)
            base, slots, key = self._key(messages, tools, previous_assistant, history, tools_key)
            shape = self._shapes.get(key) or self._learn(messages, tools, previous_assistant, history, ())
        self._remember(key, shape)
        return key, shape

    def _fill(self, shape: _Shape, messages: Sequence[Message]) -> ContextDelta | str:
        """The delta ``shape`` gives for ``messages`` (their contents and fields in its slots), or why it is
        rendered (the content merges with the close)."""
        f = shape.transform
        values = [f(messages[i]["content"]) if name == "content" else messages[i][name] for i, name in shape.slots]
        ids = self.renderer.encode("".join(_interleave(shape.pieces, values)))
        lead = shape.lead_ids
        if tuple(ids[: len(lead)]) != lead:
            return f"the content of {[m.get('role') for m in messages]} merges with the close or trailer: rendered"
        return ContextDelta(shape.close_ids, shape.trailer_ids, tuple(ids[len(lead) :]), ())

    def _served(
        self,
        key: tuple[Any, ...],
        shape: _Shape,
        delta: ContextDelta,
        messages: Sequence[Message],
        render: Callable[[], ContextDelta],
    ) -> DeltaResult:
        """``delta``, checked against a render on the shape's first use and at ``verify_rate`` after; a shape whose
        delta differs is rendered from then on."""
        first = shape.uses == 0
        shape.uses += 1
        if first or (self.verify_rate > 0.0 and self._rng.random() < self.verify_rate):
            rendered = render()
            if rendered != delta:
                why = (
                    f"learned delta for {[m.get('role') for m in messages]} differs from the template's render "
                    f"({'first use' if first else 'sampled re-check'}); this shape is rendered from now on"
                )
                self._shapes[key] = why
                self.stats.unverifiable += 1
                return DeltaResult(rendered, why)
            if not first:
                self.stats.verified += 1
            return DeltaResult(rendered)
        self.stats.learned += 1
        return DeltaResult(delta)

    # -- shapes -----------------------------------------------------------------------------------
    def _key(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None,
        previous: Message | None,
        history: History,
        tools_key: str,
    ) -> tuple[tuple[Any, ...], tuple[tuple[int, str], ...], tuple[Any, ...]]:
        """(the key without field values, the printed fields learned as slots, the shape's key)."""
        layout = tuple((str(m.get("role")), tuple(sorted(k for k in m if k != "content"))) for m in messages)
        calls = None
        if previous is not None:
            calls = tuple(_call_name(c) for c in previous.get("tool_calls") or ())
        base = (layout, calls, history, tools_key)
        relevant = self._relevant.get(base)
        if relevant is None:
            relevant = self._relevant_fields(messages, tools, previous, history)
            self._relevant[base] = relevant
        slotted = base not in self._no_slots
        slots: list[tuple[int, str]] = []
        values: list[Any] = []
        for i, k in relevant:
            value = messages[i].get(k)
            if slotted and isinstance(value, str) and len(value) >= _MIN_FIELD_SLOT and _PLAIN_FIELD.fullmatch(value):
                slots.append((i, k))
                values.append(("slot", len(value)))  # learned per length, any value of that length
            else:
                values.append(_hashable(value))
        return base, tuple(slots), (*base, tuple(values))

    def _remember(self, key: tuple[Any, ...], shape: _Shape | str) -> None:
        self._shapes[key] = shape
        self.stats.shapes = len(self._shapes)
        if isinstance(shape, str):
            self.stats.unverifiable += 1
        while len(self._shapes) > _MAX_SHAPES:
            self._shapes.popitem(last=False)

    def _relevant_fields(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None,
        previous: Message | None,
        history: History,
    ) -> tuple[tuple[int, str], ...]:
        """Non-content fields that change the delta (Mistral's ``tool_call_id``, not Qwen's): part of the key."""
        marked = _with_contents(messages, [_MARKER.format(i) for i in range(len(messages))])
        try:
            base = self._render_or_none(marked, tools, previous, history)
        except TemplateError:
            base = None
        relevant: list[tuple[int, str]] = []
        for i, m in enumerate(messages):
            for k in sorted(m):
                if k in ("role", "content"):
                    continue
                if base is None or not isinstance(m[k], str):
                    relevant.append((i, k))  # cannot tell: keep it in the key
                    continue
                altered = [dict(x) for x in marked]
                altered[i][k] = _ALTERED.format(i)
                try:
                    changed = self._render_or_none(altered, tools, previous, history) != base
                except TemplateError:
                    changed = True
                if changed:
                    relevant.append((i, k))
        return tuple(relevant)

    def _render_or_none(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None,
        previous: Message | None,
        history: History,
    ) -> ContextDelta:
        return render_context_delta(self.renderer, self.profile, messages, tools, previous, history)

    def _render_marked(
        self,
        marked: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None,
        previous: Message | None,
        history: History,
    ) -> tuple[ContextDelta, str] | str:
        """(the delta, the whole conversation's text) for messages with markers in place of their contents, or the
        template's error."""
        try:
            delta = render_context_delta(self.renderer, self.profile, marked, tools, previous, history)
            head, assistant = synthetic_history(marked, previous, history)
            text = self.renderer.render_text([*head, assistant, *marked], tools, add_generation_prompt=True)
        except TemplateError as exc:
            return str(exc)
        return delta, text

    def _learn(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None,
        previous: Message | None,
        history: History,
        fields: Sequence[tuple[int, str]],
    ) -> _Shape | str:
        """Fixed pieces around each content and each printed field in ``fields``, or why this shape must be
        rendered."""
        r = self.renderer
        roles = [m.get("role") for m in messages]
        markers = [_MARKER.format(i) for i in range(len(messages))]
        field_markers = [_field_marker(j, len(messages[i][k])) for j, (i, k) in enumerate(fields)]
        alternatives = [_field_alternative(j, len(messages[i][k])) for j, (i, k) in enumerate(fields)]
        marked = _with_fields(_with_contents(messages, markers), fields, field_markers)
        rendered = self._render_marked(marked, tools, previous, history)
        if isinstance(rendered, str):
            return f"cannot learn the delta for {roles}: {rendered}"
        delta, text = rendered
        # Learned from the assistant's close on (a special token, where tokenizers split their input), so that
        # content right after a trailer (GLM's "\n") merges with it as it does in a render.
        context = delta.close_ids + delta.trailer_ids + delta.context_ids
        if not context or context[0] not in r.added_ids:
            return f"the delta for {roles} does not start at an added token, so it cannot be encoded on its own"
        encoded = r.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
        if tuple(ids[len(ids) - len(context) :]) != context:
            return f"the delta for {roles} is not the tail of its render"
        tail = text[offsets[len(ids) - len(context)][0] :]
        tricky = [_TRICKY.format(i) for i in range(len(messages))]
        try:
            expected = render_context_delta(
                r,
                self.profile,
                _with_fields(_with_contents(messages, tricky), fields, alternatives),
                tools,
                previous,
                history,
            )
        except TemplateError as exc:
            return f"cannot render tricky contents for {roles}: {exc}"
        if (expected.close_ids, expected.trailer_ids) != (delta.close_ids, delta.trailer_ids):
            return f"the close before {roles} depends on the content"
        names = [(i, "content") for i in range(len(messages))] + list(fields)
        for f in _TRANSFORMS.values():
            found = _split(tail, [f(m) for m in markers] + field_markers)
            if found is None:
                continue
            order, pieces = found
            slots = tuple(names[n] for n in order)
            marks = [f(m) for m in markers] + field_markers
            if tuple(r.encode("".join(_interleave(pieces, [marks[n] for n in order])))) != context:
                return f"the delta for {roles} does not encode on its own to its render's tokens"
            values = [f(t) for t in tricky] + alternatives
            built = r.encode("".join(_interleave(pieces, [values[n] for n in order])))
            if tuple(built) == expected.boundary_ids:
                return _Shape(delta.close_ids, delta.trailer_ids, tuple(pieces), f, slots)
        return f"the template transforms the content of {roles} in a way not learned (not verbatim, trimmed or JSON)"


def tools_fingerprint(tools: Sequence[Mapping[str, Any]] | None) -> str:
    """A key for a tool list (computed once per rollout, not per turn)."""
    return json.dumps(tools or [], sort_keys=True, default=str)


def _split(text: str, slots: Sequence[str]) -> tuple[list[int], list[str]] | None:
    """(the slots' indices in text order, the text around them) when each slot occurs exactly once and none
    overlap; else None."""
    at: list[tuple[int, int]] = []
    for n, slot in enumerate(slots):
        found = text.find(slot)
        if found < 0 or text.find(slot, found + 1) >= 0:
            return None
        at.append((found, n))
    at.sort()
    pieces: list[str] = []
    end = 0
    for found, n in at:
        if found < end:
            return None
        pieces.append(text[end:found])
        end = found + len(slots[n])
    pieces.append(text[end:])
    return [n for _, n in at], pieces


def _interleave(pieces: Sequence[str], contents: Sequence[str]) -> list[str]:
    out = [pieces[0]]
    for content, piece in zip(contents, pieces[1:], strict=True):
        out += (content, piece)
    return out


def _with_contents(messages: Sequence[Message], contents: Sequence[str]) -> list[dict[str, Any]]:
    return [{**m, "content": c} for m, c in zip(messages, contents, strict=True)]


def _with_fields(
    messages: Sequence[dict[str, Any]], fields: Sequence[tuple[int, str]], values: Sequence[str]
) -> list[dict[str, Any]]:
    out = [dict(m) for m in messages]
    for (i, k), value in zip(fields, values, strict=True):
        out[i][k] = value
    return out


def _call_name(call: Any) -> Any:
    if isinstance(call, Mapping):
        function = call.get("function")
        if isinstance(function, Mapping):
            return _hashable(function.get("name"))
        return _hashable(call.get("name"))
    return repr(call)


def _hashable(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return json.dumps(value, sort_keys=True, default=str)


_SHARED: weakref.WeakKeyDictionary[ChatRenderer, dict[int, tuple[TemplateProfile, LearnedDeltas]]] = (
    weakref.WeakKeyDictionary()
)


def shared_deltas(renderer: ChatRenderer, profile: TemplateProfile) -> LearnedDeltas:
    """One ``LearnedDeltas`` per (renderer, profile), so rollouts share what earlier rollouts learned."""
    per_renderer = _SHARED.setdefault(renderer, {})
    entry = per_renderer.get(id(profile))
    if entry is None or entry[0] is not profile:
        entry = (profile, LearnedDeltas(renderer, profile))
        per_renderer[id(profile)] = entry
    return entry[1]
