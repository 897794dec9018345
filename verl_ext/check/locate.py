"""Where a stream position is: which turn, which region, which boundary; and how to show it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from verl_ext.check.call_index import CallIndex
from verl_ext.check.decode_memo import MemoDecode
from verl_ext.check.findings import Cause, Finding, Span
from verl_ext.check.inputs import EngineCall, rollout_assistants
from verl_ext.check.texts_alike import alike_note
from verl_ext.core.rendering import ChatRenderer

CONTEXT_TOKENS = 4  # decoded tokens shown on each side of a divergence


@dataclass(frozen=True)
class Locator:
    """The engine calls laid over the training stream: which turn, region and boundary a position is in."""

    calls: tuple[EngineCall, ...]
    next_roles: tuple[str, ...]  # per turn: the role of the message after that assistant turn, or "end"
    stream: tuple[int, ...]
    renderer: ChatRenderer
    assistant_indices: tuple[int, ...] = ()  # message index of each engine call's assistant message

    @classmethod
    def build(
        cls,
        calls: Sequence[EngineCall],
        messages: Sequence[Mapping[str, Any]],
        stream: Sequence[int],
        r: ChatRenderer,
        prompt_messages: int | None = None,
        assistants: Sequence[int] | None = None,
    ) -> Locator:
        """``assistants``: the message index of each call's assistant message when already known (``Rollout``
        computes it once); otherwise found from ``messages`` and ``prompt_messages``."""
        roles = [str(m.get("role")) for m in messages]
        if assistants is None:
            assistants = rollout_assistants(messages, len(calls), prompt_messages)
        nxt = [roles[i + 1] if i + 1 < len(roles) else "end" for i in assistants]
        nxt += ["end"] * (len(calls) - len(nxt))
        return cls(tuple(calls), tuple(nxt), tuple(stream), r, tuple(assistants))

    @cached_property
    def index(self) -> CallIndex:
        """The calls indexed by output start and end, built once: a finding's turn is a bisection, not a scan."""
        return CallIndex(self.calls)

    @cached_property
    def _memo(self) -> MemoDecode:
        """The renderer's decode memoized for this check's findings (``decode_memo``)."""
        return MemoDecode(self.renderer)

    def turn(self, position: int) -> int:
        """The engine call a stream position belongs to (0 for the prompt; ``engine_view.turn_at``)."""
        return self.index.turn(position)

    def region(self, position: int) -> str:
        """ "prompt" (before the first output), "sampled" (inside an output), "boundary" (the first 3 tokens after an
        output) or "context" (the rest after it)."""
        if not self.calls or position < self.calls[0].output_start:
            return "prompt"
        call = self.calls[self.turn(position)]
        if call.output_start <= position < call.output_end:
            return "sampled"
        return "boundary" if position - call.output_end < 3 else "context"

    def boundary(self, turn: int, region: str, span: Span) -> str:
        """ "assistant→tool" when the span is at the end of a turn or in what follows it; "" inside a turn."""
        if region == "prompt" or not self.calls:
            return ""
        if region == "sampled" and span.end < self.calls[turn].output_end:
            return ""
        return f"assistant→{self.next_roles[turn] if turn < len(self.next_roles) else 'end'}"

    def finding(
        self,
        cause: Cause,
        allowed: bool,
        stream: Span,
        rendered: Span,
        rendered_ids: Sequence[int],
        detail: str = "",
        turn: int | None = None,
        region: str | None = None,
        texts: tuple[str, str] | None = None,
    ) -> Finding:
        """A ``Finding`` at ``stream`` (turn and region from its start unless given), with the texts decoded and a few
        tokens of context on each side. ``texts``: the stream span's and ``rendered_ids``' texts, when the caller
        has decoded them already."""
        s = self.stream
        at = stream.start if stream.start < len(s) else max(len(s) - 1, 0)
        region = region or self.region(at)
        turn = self.turn(stream.start) if turn is None else turn
        d = self._memo.decode  # the few tokens around each finding: the same ids around every turn's same spot
        stream_text = d(s[stream.start : stream.end]) if texts is None else texts[0]
        rendered_text = d(rendered_ids) if texts is None else texts[1]
        detail += alike_note(self.renderer, s[stream.start : stream.end], rendered_ids, stream_text, rendered_text)
        return Finding(
            cause=cause,
            allowed=allowed,
            turn=turn,
            boundary=self.boundary(turn, region, stream),
            region=region,
            stream=stream,
            rendered=rendered,
            stream_ids=s[stream.start : stream.end],
            rendered_ids=tuple(rendered_ids),
            stream_text=stream_text,
            rendered_text=rendered_text,
            context_before=d(s[max(0, stream.start - CONTEXT_TOKENS) : stream.start]),
            context_after=d(s[stream.end : stream.end + CONTEXT_TOKENS]),
            detail=detail,
        )
