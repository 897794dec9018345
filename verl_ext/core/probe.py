"""Derive a chat template's turn boundaries by rendering probe conversations.

Nothing here branches on a model's name: every fact comes from rendering small conversations whose
message texts are unique markers, and reading the tokens around those markers. The result, a
``TemplateProfile``, is what the token trajectory needs to keep engine ids across turns and what
``verl-ext check-template`` prints before training.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from verl_ext.core.bounded_cache import LruCache
from verl_ext.core.errors import TemplateError
from verl_ext.core.rendering import ChatRenderer, Message, round_trip_failures
from verl_ext.core.template_profile import END, Boundary, Reason, Severity, StopId, TemplateProfile, Verdict
from verl_ext.core.tool_call_shape import RENDERS_NAME, RENDERS_NOTHING, ToolCallShape, derive_tool_call_shape
from verl_ext.core.unsupported_causes import explain_unsupported

APPEND_ROLES: tuple[str, ...] = ("tool", "user", "system")

# Token names that mark the end of a document or turn in most vocabularies. Engines stop on them
# even when the chat template never renders them (Qwen3 `<|endoftext|>`, GPT-OSS `<|endoftext|>`).
_END_OF_TEXT_NAME = re.compile(r"(?i)end_?of_?(text|turn|sentence)|endoftext|^</s>$|^<eos>$|eot")

PROBE_TOOL_NAME = "probe_tool"
PROBE_TOOLS: tuple[dict[str, Any], ...] = (
    {
        "type": "function",
        "function": {
            "name": PROBE_TOOL_NAME,
            "description": "A tool used to probe the chat template.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "what to look up"}},
                "required": ["query"],
            },
        },
    },
)


def added_generation_prompt(
    gen_ids: Sequence[int], head_ids: Sequence[int], control_ids: Collection[int]
) -> tuple[int, ...]:
    """What the generation prompt adds to a conversation (``gen_ids``: rendered with it, ``head_ids``: without): the
    ids after the conversation, or after what the two share where the conversation without it ends in control tokens
    only (Phi-4-mini's Ollama template writes ``</s>`` there instead of ``<|assistant|>``); empty when neither."""
    gen_ids, head_ids = tuple(gen_ids), tuple(head_ids)
    if gen_ids[: len(head_ids)] == head_ids:
        return gen_ids[len(head_ids) :]
    shared = len(os.path.commonprefix([gen_ids, head_ids]))
    rest = head_ids[shared:]
    if rest and all(i in control_ids for i in rest):
        return gen_ids[shared:]
    return ()


_ProbeKey = tuple[str, tuple[int, ...], tuple[int, ...]]
# A process probes one template, or a few (tests, the report, check-template over folders): 64 of each is room to
# spare; an evicted profile is probed again, the same.
_PROFILE_CACHE: LruCache[_ProbeKey, TemplateProfile] = LruCache("template profiles", 64)
_NAMED_CACHE: LruCache[tuple[str, tuple[int, ...], tuple[int, ...], str], TemplateProfile] = LruCache(
    "template profiles by folder", 64
)


def probe_template(renderer: ChatRenderer, extra_stop_ids: Sequence[int] = ()) -> TemplateProfile:
    """Probe ``renderer``'s template; cached per (tokenizer, template, template kwargs, stop ids, and the eos ids of
    the folder's generation_config.json: two folders with one tokenizer may stop on different ids)."""
    generation_eos = tuple(_generation_config_eos(renderer.name))
    key = (renderer.fingerprint, tuple(sorted(set(extra_stop_ids))), generation_eos)
    profile = _PROFILE_CACHE.get_or_make(key, lambda: _Prober(renderer, key[1], generation_eos).run())
    # The same tokenizer and template may live in several folders: probe once, name the folder asked about.
    named = (*key, renderer.name)
    return _NAMED_CACHE.get_or_make(named, lambda: replace(profile, tokenizer_name=renderer.name))


# ------------------------------------------------------------------------------------------------
# Probe conversations. Every text is a unique marker so it can be found in the rendered output.
_SYSTEM = {"role": "system", "content": "QXSYSTEM"}
_USER = {"role": "user", "content": "QXUSERA"}
_REASONING = "QXREASON"


def _tool_call(n: int, arguments: Any = None) -> dict[str, Any]:
    return {
        "id": f"call{n:05d}",  # 9 alphanumeric characters: Mistral's templates require exactly that
        "type": "function",
        "function": {"name": PROBE_TOOL_NAME, "arguments": arguments or {"query": f"QXARG{n}"}},
    }


# The kinds of assistant turn an engine produces: with reasoning, with an empty reasoning block (the common
# agentic turn, and what a template pre-fills when thinking is disabled), and with no reasoning field at all.
_REASONING_VARIANTS: tuple[tuple[str, str | None], ...] = (
    ("reasoning", _REASONING),
    ("empty reasoning", ""),
    ("no reasoning", None),
)


def _with_reasoning(message: dict[str, Any], reasoning: str | None) -> dict[str, Any]:
    if reasoning is not None:
        message["reasoning_content"] = reasoning
        message["thinking"] = reasoning
    return message


def _assistant_text(reasoning: str | None = _REASONING) -> dict[str, Any]:
    return _with_reasoning({"role": "assistant", "content": "QXASSISTANT"}, reasoning)


def _assistant_tools(
    n_calls: int, reasoning: str | None = _REASONING, shape: ToolCallShape | None = None
) -> dict[str, Any]:
    shape = shape or ToolCallShape()
    # A template that renders nothing of a call can only carry it in the content: give the turn a text marker.
    content: str | None = "QXASSISTANT" if shape.renders == RENDERS_NOTHING else ""
    message = {"role": "assistant", "content": content, "tool_calls": [_tool_call(i + 1) for i in range(n_calls)]}
    return shape.conform([_with_reasoning(message, reasoning)])[0]


def _tool(n: int) -> dict[str, Any]:
    return {"role": "tool", "content": f"QXTOOL{n}", "tool_call_id": f"call{n:05d}", "name": PROBE_TOOL_NAME}


_ASSISTANT_MARKERS = ("QXASSISTANT", "QXARG")
_APPENDED_MARKERS = ("QXTOOL1", "QXUSERB", "QXSYSTEMB")


class _Prober:
    def __init__(
        self, renderer: ChatRenderer, extra_stop_ids: tuple[int, ...], generation_config_eos: tuple[int, ...] = ()
    ) -> None:
        self.r = renderer
        self.extra_stop_ids = extra_stop_ids
        self.generation_config_eos = generation_config_eos
        self.reasons: list[Reason] = []
        self.examples: dict[str, str] = {}
        self.head: list[Message] = [_SYSTEM, _USER]
        self.variants: tuple[tuple[str, str | None], ...] = _REASONING_VARIANTS[:1]
        self.shape = ToolCallShape()
        self.text_closes: frozenset[int] = frozenset()  # what ends a text-only assistant turn (see close_index)

    def ending_conversation(self, role: str, calls: int = 1) -> list[dict[str, Any]]:
        """The probe's conversation ending with an assistant turn and, unless ``role`` is ``END``, a ``role`` message
        (``calls`` tool results after a turn of ``calls`` tool calls for "tool"): what ``explain_unsupported``
        renders to name the cause of a role the probe cannot append."""
        reasoning = self.variants[0][1]
        if role == "tool":
            return [*self.head, _assistant_tools(calls, reasoning, self.shape), *(_tool(n + 1) for n in range(calls))]
        appended = [] if role == END else [{"role": role, "content": "QXAPPENDED"}]
        return [*self.head, _assistant_text(reasoning), *appended]

    def note(self, severity: Severity, text: str) -> None:
        self.reasons.append(Reason(severity, text))

    def render(self, messages: Sequence[Message], gen: bool) -> tuple[str, tuple[int, ...]]:
        text = self.r.render_text(messages, PROBE_TOOLS, add_generation_prompt=gen)
        return text, tuple(self.r.encode(text))

    def run(self) -> TemplateProfile:
        """Probe the template in named steps: where the assistant's turn starts, each role's boundary, the facts
        the repairs need, and the verdict the reasons add up to."""
        self.round_trip()
        gen_ids = self.probe_head()
        _, head_ids = self.render(self.head, gen=False)
        gen_prompt = self.generation_prompt(gen_ids, head_ids)
        profile_boundaries, unsupported = self.probe_boundaries(gen_ids)
        grouped = self.tool_grouping() if "tool" not in unsupported else None
        parallel, parallel_error = self.parallel_tool_calls() if "tool" not in unsupported else (None, "")
        shared_state = self.tool_rounds_share_state() if "tool" not in unsupported else False
        stop_ids = self.stop_ids(profile_boundaries)
        strips = self.reasoning_stripping()
        args = self.tool_call_arguments()
        self.judge(profile_boundaries, unsupported, stop_ids, strips, args)
        return TemplateProfile(
            fingerprint=self.r.fingerprint,
            tokenizer_name=self.r.name,
            template_kwargs=dict(self.r.template_kwargs),
            boundaries=profile_boundaries,
            unsupported_roles=unsupported,
            stop_ids=stop_ids,
            generation_prompt_ids=gen_prompt,
            strips_reasoning=strips,
            tool_call_arguments=args,
            consecutive_tool_results_grouped=grouped,
            verdict=self.verdict(),
            reasons=tuple(self.reasons),
            rendered_examples=self.examples,
            tool_call_shape=self.shape,
            parallel_tool_calls=parallel,
            parallel_tool_calls_error=parallel_error,
            tool_rounds_share_state=shared_state,
            tokenizer_fingerprint=self.r.tokenizer_fingerprint,
        )

    def generation_prompt(self, gen_ids: tuple[int, ...], head_ids: tuple[int, ...]) -> tuple[int, ...]:
        return added_generation_prompt(gen_ids, head_ids, self.r.control_ids)

    def probe_head(self) -> tuple[int, ...]:
        """Choose the messages before the probed turn (``self.head``) and the kinds of assistant turn to probe
        (``self.variants``); returns the ids of the head rendered with the generation prompt. Each head is rendered
        once: with the system message, then, only where no turn continues that prompt, without it."""
        try:
            gen_text, gen_ids = self.render(self.head, gen=True)
            placed, last_ids = self.placed_variants(gen_text, gen_ids)
        except TemplateError:
            # The template refuses the leading system message: probe the turn boundaries without it.
            self.head = [_USER]
            gen_text, gen_ids = self.render(self.head, gen=True)
            placed, _ = self.placed_variants(gen_text, gen_ids)
        else:
            if not placed:
                self.head = [_USER]
                user_gen_text, user_gen_ids = self.render(self.head, gen=True)
                user_placed, _ = self.placed_variants(user_gen_text, user_gen_ids)
                if user_placed:
                    self.note(
                        Severity.REPAIR,
                        "moves the leading system message when the assistant replies "
                        f"({self.divergence(gen_ids, last_ids, 'the generation prompt')}); the rollout keeps the "
                        "prompt the engine saw, so the final re-render differs there",
                    )
                    # Probe the turn boundaries without the system message, with what was just rendered.
                    gen_ids, placed = user_gen_ids, user_placed
                else:
                    # Not the system message: the turn never continues the generation prompt (the END boundary
                    # says where it differs). Probe with the system message, as the engine sees it.
                    self.head = [_SYSTEM, _USER]
        # Probe every kind of turn the engine can produce after this generation prompt (with thinking disabled,
        # only turns that keep the pre-filled empty reasoning block); when none fits, the first, as before.
        self.variants = tuple(placed) or _REASONING_VARIANTS[:1]
        return gen_ids

    def probe_boundaries(self, gen_ids: tuple[int, ...]) -> tuple[tuple[Boundary, ...], dict[str, str]]:
        """Each appendable role's boundary, and for each role that cannot be appended, why (the template's error)."""
        boundaries: list[Boundary] = []
        unsupported: dict[str, str] = {}
        try:
            self.shape = self.tool_call_shape()
        except TemplateError as exc:
            unsupported["tool"] = str(exc)
        self.text_closes = self.derive_text_closes()
        cases: dict[str, tuple[Any, list[Message]]] = {
            END: (_assistant_text, []),
            "tool": (lambda reasoning: _assistant_tools(1, reasoning, self.shape), [_tool(1)]),
            "user": (_assistant_text, [{"role": "user", "content": "QXUSERB"}]),
            "system": (_assistant_text, [{"role": "system", "content": "QXSYSTEMB"}]),
        }
        for role, (assistant, appended) in cases.items():
            if role in unsupported:
                continue
            try:
                found = self.boundary_for_variants(role, gen_ids, assistant, appended)
                boundaries.append(self.single_call_close(found) if role == "tool" else found)
            except TemplateError as exc:
                unsupported[role] = str(exc)
        return tuple(boundaries), unsupported

    def single_call_close(self, boundary: Boundary) -> Boundary:
        """``boundary`` (before a tool message), or, where the template closes a turn of several calls with a text
        turn's close but writes none after a single call (DeepSeek R1's template writes
        ``<｜tool▁calls▁end｜><｜end▁of▁sentence｜>`` only in its branch for the second call on), the boundary with
        that close, marked ``close_omitted``: the single call's own end marker is the call's syntax, never the turn's
        close or a stop id (an engine stopping on it would cut a turn of several calls after the first)."""
        if not boundary.close_ids or boundary.close_ids[0] in self.text_closes or not self.text_closes:
            return boundary
        try:
            two = _assistant_tools(2, self.variants[0][1], self.shape)
            text, ids = self.render([*self.head, two, _tool(1), _tool(2)], gen=True)
            at = self.close_index(text, ids)
        except TemplateError:
            return boundary
        if at is None or ids[at] not in self.text_closes:
            return boundary
        close = self.r.decode([ids[at]])
        self.note(
            Severity.REPAIR,
            f"writes no close after a single tool call, but {close} after several (a bug of the template): a turn "
            f"keeps the close the engine samples ({close}), and the tool output that follows is the template's",
        )
        return replace(boundary, close_ids=(ids[at],), trailer_ids=(), close_omitted=True)

    def verdict(self) -> Verdict:
        """The worst severity among the reasons noted: any unsupported reason makes the template unsupported."""
        severities = {r.severity for r in self.reasons}
        if Severity.UNSUPPORTED in severities:
            return Verdict.UNSUPPORTED
        return Verdict.REPAIRABLE if Severity.REPAIR in severities else Verdict.OK

    def placed_variants(
        self, gen_text: str, gen_ids: tuple[int, ...]
    ) -> tuple[list[tuple[str, str | None]], tuple[int, ...]]:
        """The kinds of assistant turn the engine can produce after this generation prompt (each rendering once),
        and the first kind's rendering. A kind whose text continues the prompt's text is one the engine can sample
        even when its tokens do not continue the prompt's tokens (QwQ's pre-filled "<think>\n" merges with the
        "\n" of an empty reasoning block): its boundaries then say the template re-renders what the engine saw."""
        placed: list[tuple[str, str | None]] = []
        renders: set[tuple[int, ...]] = set()
        first: tuple[int, ...] = ()
        for label, reasoning in _REASONING_VARIANTS:
            text, ids = self.render([*self.head, _assistant_text(reasoning)], gen=False)
            first = first or ids
            if (ids[: len(gen_ids)] == gen_ids or text.startswith(gen_text)) and ids not in renders:
                placed.append((label, reasoning))
            renders.add(ids)
        return placed, first

    def tool_call_shape(self) -> ToolCallShape:
        """The tool-call convention this template renders (content "" or None, arguments object or string)."""
        reasoning = self.variants[0][1]
        head_text = self.r.render_text(self.head, PROBE_TOOLS, add_generation_prompt=False)

        def render(content: str | None, arguments: Any) -> str:
            message = _with_reasoning(
                {"role": "assistant", "content": content, "tool_calls": [_tool_call(1, arguments)]}, reasoning
            )
            return self.render([*self.head, message], gen=False)[0]

        shape, _ = derive_tool_call_shape(render, "QXARG1", PROBE_TOOL_NAME, head_text.count(PROBE_TOOL_NAME))
        if shape.renders == RENDERS_NAME:
            self.note(Severity.NOTE, "renders a tool call's name but not its arguments")
        elif shape.renders == RENDERS_NOTHING:
            self.note(
                Severity.NOTE,
                "renders nothing of a tool call: the assistant message's content must carry the call's text",
            )
        return shape

    def derive_text_closes(self) -> frozenset[int]:
        """The first special token after a text-only assistant turn, at the end and before a user or system
        message: the ids that end a turn as such (a tool-call turn is closed by one where it writes one)."""
        closes: set[int] = set()
        reasoning = self.variants[0][1]
        for appended in ([], [{"role": "user", "content": "QXUSERB"}], [{"role": "system", "content": "QXSYSTEMB"}]):
            try:
                text, ids = self.render([*self.head, _assistant_text(reasoning), *appended], gen=bool(appended))
                at = self.close_index(text, ids)
            except TemplateError:
                continue
            if at is not None:
                closes.add(ids[at])
        return frozenset(closes)

    def boundary_for_variants(
        self, role: str, gen_ids: tuple[int, ...], assistant: Any, appended: list[Message]
    ) -> Boundary:
        """The boundary for the first kind of turn, prefix-preserving only when it is for every kind."""
        examples = dict(self.examples)
        others = [(label, self.boundary(role, gen_ids, assistant(r), appended)) for label, r in self.variants[1:]]
        self.examples = examples
        main = self.boundary(role, gen_ids, assistant(self.variants[0][1]), appended)
        labelled = [(self.variants[0][0], main), *others]
        broken = [(label, b) for label, b in labelled if not b.prefix_preserving]
        if not broken or len(labelled) == 1:
            return replace(main, not_preserving_with=tuple(label for label, _ in broken))
        label, first = broken[0]
        return replace(
            main,
            prefix_preserving=False,
            divergence=f"with {label}: {first.divergence}",
            not_preserving_with=tuple(lb for lb, _ in broken),
        )

    # -- boundaries -------------------------------------------------------------------------------
    def boundary(self, role: str, gen_ids: tuple[int, ...], assistant: Message, appended: list[Message]) -> Boundary:
        last_text, last_ids = self.render([*self.head, assistant], gen=False)
        last_close = self.close_index(last_text, last_ids)
        placed = last_ids[: len(gen_ids)] == gen_ids
        # What the engine saw and sampled when the turn ended normally: prompt + output up to its close.
        engine_view = last_ids[: last_close + 1] if last_close is not None else last_ids
        if role == END:
            close = (last_ids[last_close],) if last_close is not None else ()
            self.examples[END] = self.r.decode(last_ids[len(gen_ids) :] if placed else last_ids)
            divergence = "" if placed else self.divergence(gen_ids, last_ids, "the generation prompt")
            # Whatever the template writes after the close at the very end (Qwen "\n", Phi "\n" + eos) is never sampled.
            trailer = tuple(last_ids[last_close + 1 :]) if last_close is not None else ()
            return Boundary(END, close, trailer, (), placed, divergence)

        text, ids = self.render([*self.head, assistant, *appended], gen=True)
        marker = str(appended[0]["content"])
        if marker not in text:
            raise TemplateError(f"the template drops the content of an appended {role!r} message")
        close_at = self.close_index(text, ids)
        if close_at is None:
            raise TemplateError(f"no special token follows the assistant turn when a {role!r} message comes next")
        close = (ids[close_at],)
        trailer = self.trailer(ids, close_at + 1)
        delta = ids[close_at + 1 + len(trailer) :]
        if marker not in self.r.decode(delta):
            raise TemplateError(
                f"the template renders an appended {role!r} message's text before the assistant turn (it moves it "
                "up, e.g. to the top of the conversation): appended mid-rollout, its text would never reach the engine"
            )
        # Prefix preservation: once a message follows the turn, does the template render the tokens
        # the engine saw? (Without a close of its own, the turn's boundary is the next opener.)
        template_view = ids[: close_at + 1] if last_close is not None else ids[:close_at]
        preserving = placed and template_view == engine_view
        if not placed:  # the turn itself does not continue the generation prompt's tokens
            divergence = self.divergence(gen_ids, ids, "the generation prompt")
        else:
            divergence = "" if preserving else self.divergence(engine_view, template_view, "the engine saw")
        self.examples[role] = self.r.decode(ids[close_at:])
        return Boundary(role, close, trailer, delta, preserving, divergence)

    def close_index(self, text: str, ids: tuple[int, ...]) -> int | None:
        """Index of the assistant turn's close: the first special token after its last marker, except that a
        turn with tool calls ends on the close of a text turn where it writes one before the next message. A
        call's own end markers come first there (Kimi-K2's <|tool_call_end|><|tool_calls_section_end|><|im_end|>,
        DeepSeek's <｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>) and are the call's syntax, not the
        turn's end; a template whose call turn has its own close (GPT-OSS <|call|>) writes no text close there."""
        start, end = self.assistant_span(text, ids)
        specials = [i for i in range(start, len(ids)) if ids[i] in self.r.structural_ids]
        preferred = [i for i in specials if i < end and ids[i] in self.text_closes]
        if preferred:
            return preferred[0]
        return specials[0] if specials else None

    def assistant_span(self, text: str, ids: tuple[int, ...]) -> tuple[int, int]:
        """Token indices (first after the assistant's last marker, first of the appended message's marker)."""
        # Only the text before the appended message belongs to the assistant turn (a tool message may repeat
        # the tool's name); a template that renders only a call's name is located by that name.
        markers = (*_ASSISTANT_MARKERS, PROBE_TOOL_NAME) if self.shape.renders == RENDERS_NAME else _ASSISTANT_MARKERS
        start = min((text.find(m) for m in markers if m in text), default=0)
        before = min((text.find(m, start) for m in _APPENDED_MARKERS if m in text[start:]), default=len(text))
        head = text[:before]
        marker_end = max((head.rfind(m) + len(m) for m in markers if m in head), default=-1)
        if marker_end < 0:
            raise TemplateError("the template does not render the assistant's content or tool call")
        offsets = self.offsets(text)
        if len(offsets) != len(ids):
            raise TemplateError("token offsets do not line up with the rendered ids")
        first = next((i for i in range(len(ids)) if offsets[i][0] >= marker_end), len(ids))
        last = next((i for i in range(first, len(ids)) if offsets[i][1] > before), len(ids))
        return first, last

    def offsets(self, text: str) -> list[tuple[int, int]]:
        enc = self.r.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return [tuple(o) for o in enc["offset_mapping"]]  # type: ignore[misc]

    def trailer(self, ids: tuple[int, ...], start: int) -> tuple[int, ...]:
        """Whitespace-only text tokens right after a close: rendered by the template, never sampled."""
        end = start
        while end < len(ids) and ids[end] not in self.r.control_ids and not self.r.decode([ids[end]]).strip():
            end += 1
        return ids[start:end]

    def divergence(self, engine_view: Sequence[int], template_view: Sequence[int], label: str) -> str:
        k = next((i for i, (a, b) in enumerate(zip(engine_view, template_view, strict=False)) if a != b), None)
        if k is None:
            k = min(len(engine_view), len(template_view))
        lo = max(0, k - 4)
        return (
            f"at token {k}: {label} {self.r.decode(engine_view[lo : k + 8])!r}, "
            f"template re-renders {self.r.decode(template_view[lo : k + 8])!r}"
        )

    def tool_grouping(self) -> bool | None:
        try:
            two = _assistant_tools(2, self.variants[0][1], self.shape)
            text, ids = self.render([*self.head, two, _tool(1), _tool(2)], gen=True)
        except TemplateError as exc:
            self.note(Severity.NOTE, f"two consecutive tool results cannot be rendered: {exc}")
            return None
        first, second = text.find("QXTOOL1"), text.find("QXTOOL2")
        between = text[first:second]
        self.examples["tool x2"] = text[text.find("QXARG2") :]
        closes_between = sum(between.count(self.r.decode([s])) for s in self.r.structural_ids if s in ids)
        return closes_between == 0

    def tool_rounds_share_state(self) -> bool:
        """Whether a second tool round (a call turn and its result) is written otherwise after a first one: what the
        template writes after the second call, alone after the prompt and after an earlier round, compared."""
        reasoning = self.variants[0][1]
        second = self.shape.conform(
            [_with_reasoning({"role": "assistant", "content": "", "tool_calls": [_tool_call(2)]}, reasoning)]
        )[0]
        try:
            alone, _ = self.render([*self.head, second, _tool(2)], gen=True)
            after, _ = self.render(
                [*self.head, _assistant_tools(1, reasoning, self.shape), _tool(1), second, _tool(2)], gen=True
            )
        except TemplateError:
            return False
        if "QXARG2" not in alone or "QXARG2" not in after:
            return False
        shared = alone[alone.rfind("QXARG2") :] != after[after.rfind("QXARG2") :]
        if shared:
            self.note(
                Severity.REPAIR,
                "writes a tool round otherwise once an earlier one is in the conversation (state it never resets): "
                "a round's context is rendered after a synthetic earlier round where the rollout had one",
            )
        return shared

    def parallel_tool_calls(self) -> tuple[bool, str]:
        """Whether one assistant turn may hold two tool calls, and the template's words when it may not."""
        # Only a template that refuses two calls has a limit: how it writes them (GPT-OSS writes the last turn's
        # calls its own way) is the template view's business, not a reason to refuse a turn.
        try:
            self.render([*self.head, _assistant_tools(2, self.variants[0][1], self.shape)], gen=False)
        except TemplateError as exc:
            self.note(Severity.NOTE, f"renders at most one tool call per assistant turn: {exc}")
            return False, str(exc)
        return True, ""

    # -- stop ids ---------------------------------------------------------------------------------
    def stop_ids(self, boundaries: Sequence[Boundary]) -> tuple[StopId, ...]:
        sources: dict[int, list[str]] = {}

        def add(token_id: int | None, source: str) -> None:
            if token_id is not None and source not in sources.setdefault(int(token_id), []):
                sources[int(token_id)].append(source)

        for b in boundaries:
            for i in b.close_ids:
                add(i, "template close")
        add(self.r.tokenizer.eos_token_id, "eos_token")
        for i in self.generation_config_eos:
            add(i, "generation_config")
        for i in self.r.structural_ids:
            if _END_OF_TEXT_NAME.search(self.r.decode([i])):
                add(i, "end-of-text name")
        for i in self.extra_stop_ids:
            add(i, "user")
        # A token the template writes instead of a close in another branch of the same choice is one of its turn
        # ends, whatever the stop lists say (Llama 3.x: {% if builtin_tools %}<|eom_id|>{% else %}<|eot_id|>):
        # an engine that stops on it has closed the turn, with or without generation_config.json.
        template = self.r.chat_template or ""
        closes = {self.r.decode([i]) for b in boundaries for i in b.close_ids}
        by_text = {self.r.decode([i]): i for i in self.r.control_ids}
        for text in branch_alternatives(template, closes, set(by_text)):
            add(by_text[text], "template text")
        # A model's own end id (not a user stop such as </tool_call>) that the template writes in some branch is a
        # turn end of the template's, not an alias.
        for i, src in sources.items():
            own_end = set(src) & {"eos_token", "generation_config", "end-of-text name"}
            written = "template close" in src or "template text" in src
            if own_end and not written and i in self.r.structural_ids and self.r.decode([i]) in template:
                src.append("template text")
        return tuple(StopId(i, self.r.decode([i]), tuple(src)) for i, src in sorted(sources.items()))

    def round_trip(self) -> None:
        """A tokenizer that does not give plain text back changes every prompt it encodes (spaces lost)."""
        failures = round_trip_failures(self.r.tokenizer)
        if failures:
            text, back = failures[0]
            self.note(
                Severity.UNSUPPORTED,
                f"the tokenizer does not round-trip plain text: {text!r} decodes as {back!r}, so every prompt it "
                "encodes differs from the text. transformers 5 replaces tokenizer.json's pre-tokenizer when "
                "tokenizer_config.json names another class (huggingface/transformers#45488); load the folder with "
                'verl_ext.core.rendering.load_tokenizer (the verl-ext CLI does), or set "tokenizer_class" to '
                '"PreTrainedTokenizerFast" in tokenizer_config.json',
            )

    # -- template habits --------------------------------------------------------------------------
    def reasoning_stripping(self) -> bool | None:
        """Whether the template drops an earlier turn's reasoning (None: it never renders reasoning). Reasoning is
        given as a message field, and, for a template that reads it from the content, as the model writes it after
        the opener its generation prompt pre-fills (QwQ and DeepSeek R1 pre-fill "<think>\n" and keep only what
        follows "</think>", even in the last turn: that template drops every turn's reasoning)."""
        user = {"role": "user", "content": "QXUSERB"}
        last, _ = self.render([*self.head, _assistant_text()], gen=False)
        if _REASONING in last:
            later, _ = self.render([*self.head, _assistant_text(), user], gen=True)
            return _REASONING not in later
        inline = self.inline_reasoning_content()
        if inline is None:
            return None
        message = {"role": "assistant", "content": inline}
        try:
            last, _ = self.render([*self.head, message], gen=False)
            later, _ = self.render([*self.head, message, user], gen=True)
        except TemplateError:
            return None
        if "QXASSISTANT" not in last:
            return None
        return _REASONING not in later

    def inline_reasoning_content(self) -> str | None:
        """Assistant content with reasoning as a model writes it after the generation prompt's pre-filled opener
        ("QXREASON\n</think>\n\nQXASSISTANT" after "<think>\n"), or None when the prompt pre-fills no opening tag
        that the turn's rendering drops."""
        gen_text, _ = self.render(self.head, gen=True)
        turn_text, _ = self.render([*self.head, _assistant_text(None)], gen=False)
        common = len(_common_prefix(gen_text, turn_text))
        if gen_text.rfind("<", 0, common) > gen_text.rfind(">", 0, common):
            common = gen_text.rfind("<", 0, common)  # never split a tag: "<think>" against "</think>"
        opener = re.match(r"\s*<([A-Za-z_][\w:.-]*)>\s*$", gen_text[common:])
        if opener is None:
            return None
        return f"{_REASONING}\n</{opener.group(1)}>\n\nQXASSISTANT"

    def tool_call_arguments(self) -> str:
        spaced = '{"query":   "QXARG1" }'
        call = {**_assistant_tools(1, self.variants[0][1], self.shape), "tool_calls": [_tool_call(1, arguments=spaced)]}
        call = self.shape.conform([call])[0]  # as every render gives it: parsed where the template takes objects only
        try:
            text, _ = self.render([*self.head, call], gen=False)
        except TemplateError:
            return "re-serialized"  # the template only accepts parsed (mapping) arguments
        if spaced in text:
            return "verbatim"
        return "re-serialized" if "QXARG1" in text else "not rendered"

    def judge(
        self,
        boundaries: Sequence[Boundary],
        unsupported: Mapping[str, str],
        stop_ids: Sequence[StopId],
        strips: bool | None,
        args: str,
    ) -> None:
        for role in ("tool", "user"):
            if role in unsupported:
                why = explain_unsupported(self, role, unsupported[role])
                self.note(Severity.UNSUPPORTED, f"cannot append a {role} message: {why}")
        if END in unsupported:
            why = explain_unsupported(self, END, unsupported[END])
            self.note(Severity.UNSUPPORTED, f"cannot place the engine's output: {why}")
        if "system" in unsupported:
            self.note(Severity.NOTE, f"system messages cannot be appended mid-conversation: {unsupported['system']}")
        for b in boundaries:
            after = "at the end of the conversation" if b.next_role == END else f"before a {b.next_role} message"
            close = self.r.decode(b.close_ids) if b.close_ids else "(no close token)"
            if b.trailer_ids and b.next_role != END:
                self.note(
                    Severity.REPAIR,
                    f"renders {self.r.decode(b.trailer_ids)!r} after {close} {after}; the engine never "
                    "generates it: restored as repair (mask 0)",
                )
            if not b.prefix_preserving:
                self.note(Severity.REPAIR, f"re-renders the assistant turn {after} ({b.divergence}); kept as sampled")
        closes = {b.next_role: self.r.decode(b.close_ids) for b in boundaries if b.close_ids}
        if len(set(closes.values())) > 1:
            listing = ", ".join(f"{role}: {text}" for role, text in closes.items())
            self.note(
                Severity.REPAIR,
                f"the turn close depends on what follows ({listing}); a turn that stopped on another of these "
                "closes keeps it (no second close is added), and the check names it close_variant",
            )
        close_ids = {i for b in boundaries for i in b.close_ids}
        written = [s for s in stop_ids if s.id not in close_ids and "template text" in s.sources]
        if written:
            self.note(
                Severity.NOTE,
                f"stop ids the template writes as a turn end in another branch: {_stop_listing(written)}; a turn "
                "ending on one keeps it as its close (no synthetic close), and the check names the difference "
                "close_variant",
            )
        aliases = [s for s in stop_ids if s.id not in close_ids and "template text" not in s.sources]
        if aliases:
            self.note(
                Severity.REPAIR,
                f"stop ids the template never renders as a close: {_stop_listing(aliases)}; a turn "
                "ending on one gets the template's close as a synthetic repair",
            )
        if strips:
            self.note(Severity.REPAIR, "strips reasoning from earlier assistant turns; the rollout keeps it as sampled")
        if args == "re-serialized":
            self.note(Severity.REPAIR, "re-serializes tool-call arguments; the rollout keeps the sampled text")


def branch_alternatives(template: str, closes: set[str], tokens: set[str]) -> set[str]:
    """Tokens (of ``tokens``) the template writes in one branch of an ``if`` where another branch of it writes only
    a close (of ``closes``): the branch's whole literal output is that one token. Such a token ends the turn in that
    branch (Llama 3.x ``<|eom_id|>`` after a builtin-tool call, ``<|eot_id|>`` otherwise)."""
    from jinja2 import nodes

    from verl_ext.core.template_env import stock_environment_template

    try:
        tree = stock_environment_template(template).environment.parse(template)
    except Exception:  # noqa: BLE001 - a template the probe renders parses; anything else has no branches to read
        return set()
    found: set[str] = set()
    for node in tree.find_all(nodes.If):
        branches = [node.body, *(e.body for e in node.elif_), node.else_]
        written = [_literal_output(branch) for branch in branches]
        if any(w in closes for w in written):
            found |= {w for w in written if w in tokens and w not in closes}
    return found


def _literal_output(branch: Sequence[Any]) -> str:
    """The text a branch writes when it holds nothing but literal output (``{{- "<|eom_id|>" }}``), else ""."""
    from jinja2 import nodes

    out = []
    for node in branch:
        if not isinstance(node, nodes.Output):
            return ""
        for part in node.nodes:
            if isinstance(part, nodes.Const) and isinstance(part.value, str):
                out.append(part.value)
            elif isinstance(part, nodes.TemplateData):
                out.append(part.data)
            else:
                return ""
    return "".join(out).strip()


def _stop_listing(stops: Sequence[StopId]) -> str:
    """Stop ids as a reason names them: ``text (id, source/source), ...``."""
    return ", ".join(f"{s.text} ({s.id}, {'/'.join(s.sources)})" for s in stops)


def _common_prefix(a: str, b: str) -> str:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return a[:n]


def _generation_config_eos(tokenizer_dir: str) -> list[int]:
    path = Path(tokenizer_dir) / "generation_config.json"
    if not path.is_file():
        return []
    eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(i) for i in eos]
