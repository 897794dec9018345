"""Template view: render the final messages with the chat template, align, and explain each divergence.

The training stream is the engine's tokens; the re-render is what ``apply_chat_template`` would give for
the same conversation. Where they differ, a rule names the cause. Rules look at tokens and the template
profile only (never at a model name), in a fixed order; what no rule explains is ``UNKNOWN``.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from verl_ext.check.align import align, check_deadline
from verl_ext.check.findings import Cause, Finding, Span
from verl_ext.check.locate import Locator
from verl_ext.core.probe import END, TemplateProfile
from verl_ext.core.rendering import ChatRenderer


def template_findings(
    loc: Locator,
    profile: TemplateProfile,
    renderer: ChatRenderer,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    explained: set[int],
    allowed: Callable[[Cause], bool],
    deadline: float | None = None,
) -> list[Finding]:
    """Findings for every divergence between ``loc.stream`` and the template's rendering of ``messages``.

    ``explained`` holds stream positions already covered by turn-end findings; a divergence made only of
    those positions is not reported twice. Past ``deadline`` (a ``time.perf_counter()`` value) it raises
    ``BudgetExceeded`` saying how far it got, rather than run on.
    """
    stream = loc.stream
    # The tool-call convention the trajectory rendered with (content None or "", arguments object or string).
    shaped = profile.tool_call_shape.conform(messages)
    native = renderer.render(shaped, tools, add_generation_prompt=False, escape=False).ids
    check_deadline(deadline, f"after rendering the conversation ({len(native)} tokens)")
    rules = _Rules(loc, profile, renderer, messages, stream, native, deadline)
    out: list[Finding] = []
    divergent = [op for op in rules.opcodes if op[0] != "equal"]
    for k, (_tag, i1, i2, j1, j2) in enumerate(divergent):
        check_deadline(deadline, f"explaining divergence {k + 1} of {len(divergent)}")
        if i2 == len(stream) and j2 == len(native):
            # Nothing is trained after the last token: the END close and trailer the template renders there (and
            # a stream cut before them) change nothing. Compare what comes before them.
            j2 -= rules.end_close_suffix(native[j1:j2])
            if i1 == i2:
                continue  # rendered-only text after the last stream token (a response cut inside context)
        if i1 < i2 and j1 == j2 and all(i in explained for i in range(i1, i2)):
            continue
        cause, detail = rules.classify(i1, i2, j1, j2)
        out.append(loc.finding(cause, allowed(cause), Span(i1, i2), Span(j1, j2), native[j1:j2], detail))

    if renderer.escapes(messages):
        # Untrusted content holds special-token text. The native render turns it into special tokens,
        # so only a comparison with the escaped render shows a stream that did the same.
        escaped = renderer.render(shaped, tools, add_generation_prompt=False, escape=True)
        check_deadline(deadline, "after rendering the conversation with special-token text escaped")
        special = renderer.control_ids
        for tag, i1, i2, j1, j2 in align(stream, escaped.ids, deadline):
            s_ids, e_ids = stream[i1:i2], escaped.ids[j1:j2]
            if tag == "replace" and set(s_ids) & special and renderer.decode(s_ids) == renderer.decode(e_ids):
                detail = "special-token text in tool/user/system content became a real special token"
                cause = Cause.SPECIAL_TOKEN_INJECTED
                out.append(loc.finding(cause, allowed(cause), Span(i1, i2), Span(j1, j2), e_ids, detail))
    return sorted(out, key=lambda f: (f.stream.start, f.cause.value))


class _Rules:
    def __init__(
        self,
        loc: Locator,
        profile: TemplateProfile,
        renderer: ChatRenderer,
        messages: Sequence[Mapping[str, Any]],
        stream: Sequence[int],
        rendered: Sequence[int],
        deadline: float | None = None,
    ) -> None:
        self.loc = loc
        self.profile = profile
        self.r = renderer
        self.stream = stream
        self.rendered = rendered
        self.closes = profile.close_id_set
        self.turn_ends = profile.turn_end_id_set
        self.aliases = profile.alias_id_set
        self.stops = profile.stop_id_set
        self.assistants = [messages[i] for i in loc.assistant_indices]
        self.opcodes = align(stream, rendered, deadline)  # the alignment: computed once, read by every rule

    def end_close_suffix(self, ids: Sequence[int]) -> int:
        """How many of ``ids``' last tokens are the template's END close and/or trailer (0 if none)."""
        end = self.profile.boundary(END)
        ids = tuple(ids)
        for tail in (end.close_ids + end.trailer_ids, end.trailer_ids, end.close_ids):
            if tail and ids[-len(tail) :] == tail:
                return len(tail)
        return 0

    def classify(self, i1: int, i2: int, j1: int, j2: int) -> tuple[Cause, str]:
        s_ids, r_ids = tuple(self.stream[i1:i2]), tuple(self.rendered[j1:j2])
        ds, dr = self.r.decode(s_ids), self.r.decode(r_ids)
        special = self.r.control_ids
        region = self.loc.region(min(i1, max(len(self.stream) - 1, 0)))
        at_boundary = region in ("boundary", "context") or (i1 == i2 and self._at_turn_end(i1))

        if ds == dr:
            if set(r_ids) & special and not set(s_ids) & special:
                return Cause.SPECIAL_TOKEN_ESCAPED, "special-token text in content kept as text, as the engine saw it"
            return Cause.BPE_REMERGE, f"same text, {len(s_ids)} ids in the stream vs {len(r_ids)} when re-encoded"
        if self._normalized(ds) == self._normalized(dr):
            return Cause.BPE_REMERGE, "re-encoding normalizes the sampled text (the tokenizer's normalizer)"
        at_end = self._touches_turn_end(i1, i2) or region == "boundary"
        if at_end and len(s_ids) == 1 and s_ids[0] in self.turn_ends and len(r_ids) == 1 and r_ids[0] in self.closes:
            return (
                Cause.CLOSE_VARIANT,
                f"the turn ended on {ds!r}, one of the template's turn ends; it writes {dr!r} here",
            )
        if at_end and s_ids and s_ids[-1] in self.aliases and set(r_ids) & self.closes:
            return Cause.CLOSE_MISSING, f"the turn stopped on {self.r.decode(s_ids[-1:])!r} and has no close"
        if at_end and set(r_ids) & self.closes and not set(s_ids) & self.closes:
            has = f"has {ds!r}" if ds else "has nothing there"
            return Cause.CLOSE_MISSING, f"the template closes the turn with {dr!r}; the stream {has}"
        if s_ids and not r_ids and set(s_ids) <= self.aliases:
            return Cause.EOS_ALIAS, f"the stream keeps the sampled stop {ds!r}, which the template never renders"
        if i1 > 0 and len(s_ids) == 1 and not r_ids and s_ids[0] in self.stops and self.stream[i1 - 1] == s_ids[0]:
            return Cause.AMBIGUOUS_STOP_DUPLICATED, f"{ds!r} appears twice: sampled, then again as the next opener"
        moved = self._moved(ds, dr, region)
        if moved:
            return Cause.CONTEXT_MOVED, (
                f"the template renders {moved!r} at another place of the final conversation (a tool list written "
                "before the last user message); the stream keeps it where the engine saw it"
            )
        if region == "context" and self._call_names_swapped(ds, dr):
            return Cause.TOOL_RESULT_LABELLED, (
                f"the tool result is labelled with its own call's name {ds.strip(_NAME_EDGE)!r}; the template labels "
                f"it {dr.strip(_NAME_EDGE)!r}, another call of the same turn (it names every result after one call)"
            )
        if at_boundary and not s_ids and not dr.strip():
            return Cause.BOUNDARY_MISSING, f"the template renders {dr!r} here; the stream does not have it"
        prefill = self._prefill_dropped(i1, i2) if not r_ids else None
        if prefill == "prefill":
            return Cause.PREFILL_DROPPED, (
                f"the generation prompt pre-filled {ds!r} before this turn; the template does not re-render it once "
                "the turn is history (e.g. an empty think block with thinking disabled); kept as the engine saw it"
            )
        if prefill == "prefill and sampled" and self.profile.strips_reasoning:
            return Cause.REASONING_STRIPPED, (
                f"the template drops this turn's thinking {ds!r}: the opener the generation prompt pre-filled and the "
                "sampled reasoning after it; kept as the engine saw it"
            )
        no_stop = not set(r_ids) & self.stops
        if not s_ids and no_stop and self.profile.strips_reasoning is not None and self._at_turn_start(i1):
            return Cause.REASONING_INSERTED, f"the template renders {dr!r} before the sampled text; never sampled"
        if region == "sampled":
            turn = self.loc.turn(i1)
            if self._inside_json(turn, i1) and self._tool_calls_equal(turn):
                return Cause.TOOL_CALL_RESERIALIZED, "tool-call JSON is the same object, serialized differently"
            if self.profile.strips_reasoning and len(ds) > len(dr) and _squash(dr) in _squash(ds):
                return Cause.REASONING_STRIPPED, f"the template drops {len(ds) - len(dr)} characters of this turn"
        if region == "sampled" and len(self.assistants) < len(self.loc.calls) and not r_ids:
            return Cause.UNKNOWN, (
                f"the final messages hold {len(self.assistants)} assistant messages for {len(self.loc.calls)} engine "
                f"calls: sampled text {ds[:80]!r} has no message (the loop dropped a turn from its messages)"
            )
        leaked = sorted({self.r.decode([i]) for i in r_ids if i in self.stops} & self._assistant_texts())
        if not s_ids and leaked:
            return Cause.STOP_TEXT_IN_MESSAGE, (
                f"the template renders {dr!r} that the stream lacks: an assistant message's content holds the stop "
                f"token text {leaked[0]!r} (the loop decoded the stop token into the message)"
            )
        return Cause.UNKNOWN, f"stream {ds!r} vs template {dr!r}"

    def _moved(self, ds: str, dr: str, region: str) -> str:
        """The text of a one-sided divergence (only in the stream, or only in the render) in the prompt or the context
        when the other side holds it elsewhere: a moved block, not a lost or an added one. In the context, a block
        one side holds more often than the other is duplicated, not moved. Short texts never count."""
        if bool(ds) == bool(dr) or region not in ("prompt", "context"):
            return ""
        text = (ds or dr).strip()
        mine, other = (self._stream_text, self._rendered_text) if ds else (self._rendered_text, self._stream_text)
        held = other.count(text)
        if len(text) < _MOVED_MIN_CHARS or not held:
            return ""
        # The first prompt is what the engine saw first: a block the template later renders elsewhere moved there.
        return text if region == "prompt" or mine.count(text) <= held else ""

    @functools.cached_property
    def _rendered_text(self) -> str:
        return self.r.decode(self.rendered)

    @functools.cached_property
    def _stream_text(self) -> str:
        return self.r.decode(self.stream)

    def _call_names_swapped(self, ds: str, dr: str) -> bool:
        """Both sides are names of tool calls one assistant turn made, and they differ."""
        a, b = ds.strip(_NAME_EDGE), dr.strip(_NAME_EDGE)
        if not a or not b or a == b:
            return False
        for m in self.assistants:
            names = {
                str((c.get("function") or c).get("name", ""))
                for c in m.get("tool_calls") or []
                if isinstance(c, Mapping)
            }
            if a in names and b in names:
                return True
        return False

    def _prefill_dropped(self, i1: int, i2: int) -> str | None:
        """A stream-only span that starts in the generation prompt right before a turn's output and is the end of
        it: "prefill" when it stops there, "prefill and sampled" when it runs on into the turn's output."""
        gen = tuple(self.profile.generation_prompt_ids)
        for c in self.loc.calls:
            start = c.output_start
            if not gen or not start - len(gen) <= i1 < start or i2 > c.output_end:
                continue
            head = tuple(self.stream[i1:start] if i2 > start else self.stream[i1:i2])
            if i2 <= start and any(gen[k : k + len(head)] == head for k in range(len(gen) - len(head) + 1)):
                return "prefill"
            if i2 > start and gen[len(gen) - len(head) :] == head:
                return "prefill and sampled"
        return None

    def _assistant_texts(self) -> set[str]:
        """Stop-token strings that appear in assistant message content."""
        texts = " ".join(str(m.get("content") or "") for m in self.assistants)
        return {self.r.decode([i]) for i in self.stops if self.r.decode([i]) in texts}

    def _normalized(self, text: str) -> str:
        """``text`` as the tokenizer's own normalizer leaves it (Qwen: NFC); unchanged when it has none."""
        normalizer = getattr(self.r.tokenizer.backend_tokenizer, "normalizer", None)
        return normalizer.normalize_str(text) if normalizer is not None else text

    def _touches_turn_end(self, i1: int, i2: int) -> bool:
        return any(i1 <= c.output_end <= max(i1, i2) for c in self.loc.calls)

    def _at_turn_start(self, position: int) -> bool:
        return any(position == c.output_start for c in self.loc.calls)

    def _at_turn_end(self, position: int) -> bool:
        return any(position == c.output_end for c in self.loc.calls)

    def _inside_json(self, turn: int, position: int) -> bool:
        """The divergence starts inside a JSON object of the sampled text (or at its opening brace)."""
        before = self.r.decode(self.stream[self.loc.calls[turn].output_start : position])
        return before.count("{") > before.count("}") or self.r.decode(self.stream[position : position + 1]) == "{"

    def _tool_calls_equal(self, turn: int) -> bool:
        """The turn's tool-call JSON objects parse equal on both sides (only their text differs)."""
        if turn >= len(self.assistants) or not self.assistants[turn].get("tool_calls"):
            return False
        call = self.loc.calls[turn]
        j_start, j_end = self._rendered_index(call.output_start), self._rendered_index(call.output_end)
        ours = _json_objects(self.r.decode(call.output_ids))
        theirs = _json_objects(self.r.decode(self.rendered[j_start:j_end]))
        return bool(ours) and ours == theirs

    def _rendered_index(self, i: int) -> int:
        for tag, i1, i2, j1, j2 in self.opcodes:
            if i1 <= i < i2 or (i == i2 and tag != "equal"):
                return j1 + (i - i1) if tag == "equal" else (j1 if i == i1 else j2)
        return len(self.rendered)


_MOVED_MIN_CHARS = 24
_NAME_EDGE = " .:=\"'"  # what a template writes around a tool name ("functions.NAME to=")


def _squash(text: str) -> str:
    return "".join(text.split())


def _json_objects(text: str) -> Counter[str]:
    """Every top-level JSON object in ``text``, canonicalized (sorted keys, no whitespace)."""
    decoder = json.JSONDecoder()
    found: Counter[str] = Counter()
    i = text.find("{")
    while i != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict):
            found[json.dumps(obj, sort_keys=True, separators=(",", ":"))] += 1
        i = text.find("{", end)
    return found
