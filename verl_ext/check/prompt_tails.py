"""Prompt tails: the text before a turn's output the template does not write once the turn is history."""

from __future__ import annotations

import functools

from verl_ext.check.cause_rules import Divergence
from verl_ext.check.template_marks import PROMPT_CONTEXTS, prompt_tail


class PromptTails:
    """The prompt tails before each turn's output that the template does not write once the turn is history (a
    generation prompt's pre-fill; a block it closes only before a generation), and the rules' questions about them.
    Mixed into ``RuleContext``, whose stream, profile, messages and call index it reads."""

    def _in_prefill(self, d: Divergence, output_start: int) -> bool:
        """The divergence's part before the turn's output lies in the prompt's tail the template does not write
        once the turn is history (a generation prompt's pre-fill; see ``_prefills``)."""
        turn = self.index.first_starting_at(output_start)
        for tail in self._prefills(turn):
            begin = output_start - len(tail)
            if begin <= d.i1 < output_start and tuple(self.stream[begin:output_start]) == tail:
                return True
        return False

    def _prefills(self, turn: int | None) -> tuple[tuple[int, ...], ...]:
        """The prompt tails before ``turn``'s output that the template may not write once the turn is history: its
        generation prompt (whose pre-fill, Qwen3's empty think block with thinking off, it drops), and what it wrote
        after the message before the turn that it does not write once this kind of assistant message follows
        (DeepSeek-R1 closes its tool outputs block with ``<｜tool▁outputs▁end｜>`` before a generation, and writes
        the next tool-call turn into the block instead). Computed once per turn."""
        if turn not in self._prefill_tails:
            self._prefill_tails[turn] = self._prompt_tails_before(turn)
        return self._prefill_tails[turn]

    def _prompt_tails_before(self, turn: int | None) -> tuple[tuple[int, ...], ...]:
        gen = tuple(self.profile.generation_prompt_ids)
        if turn is None or turn >= len(self.loc.assistant_indices):
            return (gen,) if gen else ()
        at = self.loc.assistant_indices[turn]
        role = str(self.messages[at - 1].get("role", "")) if 0 < at <= len(self.messages) else ""
        calls = bool(self.messages[at].get("tool_calls")) if at < len(self.messages) else False
        tail = prompt_tail(self.r, self.profile, role, calls) if role in PROMPT_CONTEXTS else ()
        return tuple(t for t in dict.fromkeys((gen, tail)) if t)

    def prompt_intact(self, start: int) -> bool:
        """The stream holds the template's whole generation prompt right before the output at ``start`` (what
        verl_ext wrote before each engine call); true where the template has none."""
        gen = tuple(self.profile.generation_prompt_ids)
        return not gen or tuple(self.stream[max(start - len(gen), 0) : start]) == gen

    def _prefill_dropped(self, i1: int, i2: int) -> str | None:
        """A stream-only span that starts in the generation prompt right before a turn's output and is the end of
        it: "prefill" when it stops there, "prefill and sampled" when it runs on into the turn's output."""
        # only a turn whose output starts within the longest pre-fill after i1 can hold i1 in its pre-fill
        for turn in self.index.starting_within(i1 + 1, i1 + self._prefill_reach):
            c = self.loc.calls[turn]
            start = c.output_start
            for gen in self._prefills(turn):
                # The prompt the engine saw ends with it, intact (a pre-fill written twice is not one).
                if (
                    not start - len(gen) <= i1 < start
                    or i2 > c.output_end
                    or tuple(self.stream[start - len(gen) : start]) != gen
                ):
                    continue
                head = tuple(self.stream[i1:start] if i2 > start else self.stream[i1:i2])
                if i2 <= start and any(gen[k : k + len(head)] == head for k in range(len(gen) - len(head) + 1)):
                    return "prefill"
                if i2 > start and gen[len(gen) - len(head) :] == head:
                    return "prefill and sampled"
        return None

    @functools.cached_property
    def _prefill_reach(self) -> int:
        """The longest prompt tail before any turn that the template may not write once it is history."""
        return max((len(t) for k in range(len(self.loc.calls)) for t in self._prefills(k)), default=0)
