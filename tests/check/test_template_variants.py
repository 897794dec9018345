"""The loop-output property on templates nobody shipped: every generated variant (tests/template_variants.py).

Per variant (a fixture template with the whitespace around its calls edited, on a tokenizer where its call markers
are special tokens or plain text), rollouts are built as ``verl_ext_tool_agent`` builds them
(``loop_rollouts.build_loop_rollout``), read as the loop reads (verl's parser that reads the template's calls,
``tool_parser_fit``, with the reader derived from the variant behind it; the derived reader alone where verl has no
parser for it), from calls as models write them: 1-3 calls per turn (1 where the template renders one), their
arguments of every JSON type, the template's text for them with its JSON re-dumped (key order, separators) and the
whitespace next to its markers dropped, doubled or changed (but inside a keyed parameter's string or boolean value,
where it is the value's own text: ``value_spans``), text before the calls, a reasoning block where the template
renders one. Three properties:

- ``test_calls_as_models_write_them``: 0 defects and every call read exactly (the message's calls equal the drawn
  calls by value);
- ``test_marker_text_inside_arguments``: the same with a string argument holding the template's call-marker text;
- ``test_mutations_caught_in_their_turn``: on the variant's own rendering of two calls, a changed argument, one
  character of a value changed, a value given a leading space, a dropped call and swapped calls in the message are
  each reported in the call turn.

A seeded sample of the variants per edit class (``SAMPLE_PER_CLASS``): ``bench/check_false_alarms.py --variants``
runs all of them with rates. Failures of a class another change is fixing are strict xfails (``KNOWN_FAILURES``):
when the fix lands the test XPASSes and the entry goes.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
from typing import Any

import pytest
from call_reader_cases import (
    PARAMS,
    PROMPT,
    TOOLS,
    ChangesArguments,
    arguments,
    assistant_message,
    rendered_turn,
    tool_close,
    varied_text,
)
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from loop_rollouts import build_loop_rollout
from template_variants import EDITS, EXAMPLE_CALLS, Built, Variant, all_variants, build

from verl_ext.check import ConsistencyChecker
from verl_ext.check.policy import CheckPolicy
from verl_ext.core.call_reader.form import NAME_KEYED
from verl_ext.core.call_reader.leftover import call_text_left

SEED = 37
SAMPLE_PER_CLASS = 2  # variants per edit class in the suite (the bench runs them all)
# The templates the suite derives variants from, one per way of writing calls (hermes JSON in tags; keyed XML
# parameters; name then JSON in a closed section; a JSON list with ids; Kimi's counted names): generating every
# template's variants loads every tokenizer (30 s of CPU here), the bench's job.
SUITE_CASES = (
    "qwen3",
    "qwen3/qwen3-coder-30b-a3b-instruct_ollama-gguf",
    "templates/deepseek-ai-DeepSeek-V3",
    "mistral-7b-v0.3",
    "templates/moonshotai-Kimi-K2",
)
NAMES = ("calculator", "web_search", "get-weather")
# Room for every drawn turn: a rollout cut by the response length holds calls no reader can read exactly (two turns
# of three keyed calls with marker text run past 512 tokens where the markers are plain text); cuts are tested apart.
RESPONSE_LENGTH = 4096


def sampled_variants(per_class: int = SAMPLE_PER_CLASS, seed: int = SEED) -> list[Variant]:
    """A seeded sample of the kept variants: up to ``per_class`` per edit class, their kinds alternating."""
    rng = random.Random(seed)
    out: list[Variant] = []
    kept = [v for v, why in all_variants(SUITE_CASES) if not why]
    for edit in EDITS:
        pool = [v for v in kept if v.edit == edit]
        rng.shuffle(pool)
        for kind in ("plain", "special"):
            out += [v for v in pool if v.kind == kind][: (per_class + (kind == "plain")) // 2]
    return out


_BUILT: dict[str, Built | str] = {}


def built(variant: Variant) -> Built | str:
    """The variant built once per process (a text: why it cannot be)."""
    if variant.name not in _BUILT:
        _BUILT[variant.name] = build(variant)
    return _BUILT[variant.name]


_PARSERS: dict[str, Any] = {}


def loop_parser(b: Built) -> Any:
    """verl's parser that reads the variant's calls (the first ``tool_parser_fit`` names), or None (the derived reader
    alone)."""
    if b.variant.name not in _PARSERS:
        from verl.experimental.agent_loop.tool_parser import ToolParser

        from verl_ext.plugin.tool_parser_fit import tool_parser_fit

        fit = tool_parser_fit(b.renderer, b.profile)
        _PARSERS[b.variant.name] = (
            ToolParser.get_tool_parser(fit.readers[0], b.renderer.tokenizer) if fit.readers else None
        )
    return _PARSERS[b.variant.name]


def marker_strings(b: Built) -> list[str]:
    """String argument values holding the template's call-marker text (an agent editing code about tool calls); in a
    keyed form also its value close alone (text: the form does not go on after it), and the template's own text
    between two parameters, whitespace and all (``ambiguous_text``: the render of another call)."""
    ms = [m for m in b.markers.call_markers if m]
    out = [f"see {m} here" for m in ms[:3]] + ["```json\n{}\n```"]
    form = b.reader.form
    if form.encoding == NAME_KEYED:
        close = "".join(form.value_post)
        out += [f"see {close} here", ambiguous_text(b)]
    return out


def ambiguous_text(b: Built) -> str:
    """A keyed value holding the template's text between two parameters (``a``, then a parameter ``expression2``
    holding ``5``): the template renders the call with that value as it renders the call with the two values."""
    form = b.reader.form
    head, key_value = "".join(form.key_pre), "".join(form.key_value)
    return f"a{form.value_close}{head}expression2{key_value}{form.value_open}5"


@st.composite
def call_turn(draw: Any, b: Built, inside: bool) -> tuple[str, list[tuple[str, dict[str, Any]]], dict[str, Any]]:
    """One turn's text as a model writes it, the calls it holds and the message rendered for it (see the module's
    doc); ``inside``: a string argument of the first call holds call-marker text."""
    several = b.reader.form.several
    drawn = [
        (draw(st.sampled_from(NAMES)), draw(arguments())) for _ in range(draw(st.integers(1, 3)) if several else 1)
    ]
    if inside:
        drawn[0] = (drawn[0][0], {**drawn[0][1], "expression": draw(st.sampled_from(marker_strings(b)))})
    message = assistant_message(b.profile, drawn, content=draw(st.sampled_from(["", "Let me see."])))
    if "reasoning_content" in (b.renderer.chat_template or ""):
        message["reasoning_content"] = draw(st.sampled_from(["", "I need the calculator."]))
    text = rendered_turn(b.renderer, b.profile, message)
    if text is not None and b.markers.start not in text:  # the template drops the calls beside content (DeepSeek
        # V3 renders a message with content as its content alone): no model trained on it writes both
        message = {**message, **assistant_message(b.profile, drawn)}
        text = rendered_turn(b.renderer, b.profile, message)
    assert text, f"{b.variant.name}: the variant renders no turn for {message}"
    text = before_a_stop(b, text)
    if inside and b.reader.form.encoding == NAME_KEYED and drawn[0][1]["expression"] == ambiguous_text(b):
        return text, drawn, message  # as rendered: respacing inside the value would write another value
    return draw(st.one_of(st.just(text), varied_turn(b, text))), drawn, message


# Keyed parameters whose value's whitespace is the value's own: a string's text (Qwen3-Coder's parser, verl's
# qwen3_coder, keeps all but the template's newline on each side), and a boolean (that parser compares the text
# with "true" as it is: " True" reads false). A model spacing these otherwise writes another value, not the same
# call spaced otherwise; numbers, JSON and Python literals read the same with any whitespace around them.
_VALUE_IS_TEXT = tuple(k for k, t in PARAMS.items() if t in ("string", "boolean"))


def value_spans(b: Built, text: str) -> list[tuple[int, int]]:
    """Where ``text`` holds the value of a keyed parameter in ``_VALUE_IS_TEXT`` (the template's newlines around it
    included), each up to the close the derived reader ends it at (``KeyedValues``: a close marker inside the value
    is the value's); none where the template writes no keyed parameters."""
    if b.reader.form.encoding != NAME_KEYED:
        return []
    values, out, at = b.reader.values, [], 0
    pre = "".join(b.reader.form.key_pre)  # the whole head, never a "=NAME>" of another tag
    while (found := text.find(pre, at)) != -1:
        h = values.head.match(text, found)
        end = values.value_end(text, h.end()) if h is not None else None
        if h is None or end is None:
            break
        if h.group("key") in _VALUE_IS_TEXT:
            close = text[end[0] : end[1]]
            out.append((h.end(), end[0] + len(close) - len(close.lstrip())))
        at = end[1]
    return out


@st.composite
def varied_turn(draw: Any, b: Built, text: str) -> str:
    """``varied_text`` outside the values whose whitespace is theirs (``value_spans``), which stay as written."""
    out, at = [], 0
    for start, end in value_spans(b, text):
        out += [draw(varied_text(text[at:start])), text[start:end]]
        at = end
    return "".join([*out, draw(varied_text(text[at:]))])


def before_a_stop(b: Built, text: str) -> str:
    """``text`` up to a stop the template writes after the calls (R1-Distill writes the content after them, behind
    ``<｜end▁of▁sentence｜><｜Assistant｜>``): the engine ends the turn there. A stop with calls after it (harmony's
    ``<|end|>`` after the analysis) stays."""
    for stop in sorted(b.profile.stop_id_set | b.profile.close_id_set):
        at = text.find(b.renderer.decode([stop]))
        if at > 0 and not any(m in text[at:] for m in b.markers.call_markers):
            text = text[:at]
    return text


def loop_rollout(b: Built, turns: list[str], texts: list[str]) -> tuple[Any, Any]:
    """(the loop's state, the ``Rollout``) for call turns ``turns`` (each closed as the template closes a call turn)
    then an answer."""
    r, profile = b.renderer, b.profile
    outputs = [[*r.encode(t), tool_close(profile)] for t in turns]
    outputs.append([*r.encode("The answer is 3."), min(profile.close_id_set)])
    return build_loop_rollout(
        r,
        profile,
        loop_parser(b),
        outputs,
        texts,
        tools=TOOLS,
        prompt=PROMPT,
        max_parallel_calls=8,
        call_reader=b.reader,
        response_length=RESPONSE_LENGTH,
    )


def read_calls(lr: Any) -> list[list[tuple[str, Any]]]:
    """The calls of each assistant message the loop built, by value."""
    out = []
    for m in lr.trajectory.messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            out.append([(c["function"]["name"], _value(c["function"]["arguments"])) for c in m["tool_calls"]])
    return out


def _value(arguments: Any) -> Any:
    try:
        return json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        return arguments


@dataclasses.dataclass
class Outcome:
    """One rollout's verdict: the defects (cause, turn, detail), the calls misread (drawn vs read), the call-marker
    text a message's content holds (the reader left it there), and whether every misread turn is an ambiguous
    render (the template renders the calls read exactly as it renders the calls drawn: no reader can tell them
    apart, proven by rendering both)."""

    defects: list[tuple[str, int, str]]
    misread: list[tuple[Any, Any]]
    text: list[str]
    left: list[str] = dataclasses.field(default_factory=list)
    ambiguous: bool = False


def one_rollout(data: Any, b: Built, checker: ConsistencyChecker, inside: bool) -> Outcome:
    """A drawn rollout of 1-2 call turns checked: its defects and misread calls."""
    drawn = [data.draw(call_turn(b, inside)) for _ in range(data.draw(st.integers(1, 2)))]
    texts = data.draw(st.lists(st.sampled_from(["3", "", "x\ny", "café"]), max_size=4))
    lr, rollout = loop_rollout(b, [t for t, _, _ in drawn], texts)
    result = checker.check_rollout(rollout, template_view=True)
    defects = [(f.cause.value, f.turn, f.detail[:300]) for f in result.findings if not f.allowed]
    defects += [("engine_failure", -1, str(e)[:300]) for e in result.engine_failures]
    read = read_calls(lr)
    want = [d for _, d, _ in drawn]
    misread = [] if read == want else [(want, read)]
    ambiguous = (
        bool(misread)
        and len(read) == len(want)
        and all(r == w or same_render(b, message, r) for (_, w, message), r in zip(drawn, read, strict=True))
    )
    left = [left_in_content(b, m) for m in lr.trajectory.messages if m["role"] == "assistant"]
    return Outcome(defects, misread, [t for t, _, _ in drawn], [x for x in left if x], ambiguous)


def same_render(b: Built, message: dict[str, Any], read: list[tuple[str, Any]]) -> bool:
    """Whether the template renders ``message`` with the calls ``read`` instead of its own exactly as it renders
    ``message``: the two calls are one text (an ambiguous render)."""
    if not all(isinstance(args, dict) for _, args in read):
        return False
    other = {**message, "tool_calls": assistant_message(b.profile, read)["tool_calls"]}
    return rendered_turn(b.renderer, b.profile, other) == rendered_turn(b.renderer, b.profile, message)


def left_in_content(b: Built, message: dict[str, Any]) -> str:
    """The call-marker text an assistant message's content holds outside JSON strings ("" where none): what a
    reader consumed (a section's close) is never left there (DeepSeek V3's ``<｜tool▁calls▁end｜>``)."""
    content = message.get("content")
    return (call_text_left(b.reader.form, content) or "") if isinstance(content, str) else ""


# Mutations of the message the loop built from the variant's own two calls (the engine's stream is left as sampled).
def _changed_argument(calls: list[dict[str, Any]]) -> None:
    f = calls[0]["function"]
    other = {"expression": "changed"}
    f["arguments"] = json.dumps(other) if isinstance(f["arguments"], str) else other


def _edited_value(edit: Any) -> Any:
    """A mutation changing the first call's ``expression`` with ``edit``, its other arguments kept (inside one
    parameter, where a keyed template writes one per argument)."""

    def mutate(calls: list[dict[str, Any]]) -> None:
        f = calls[0]["function"]
        args = json.loads(f["arguments"]) if isinstance(f["arguments"], str) else dict(f["arguments"])
        args["expression"] = edit(args["expression"])
        f["arguments"] = json.dumps(args) if isinstance(f["arguments"], str) else args

    return mutate


def _dropped_call(calls: list[dict[str, Any]]) -> None:
    del calls[1]


def _swapped_calls(calls: list[dict[str, Any]]) -> None:
    calls[0]["function"], calls[1]["function"] = calls[1]["function"], calls[0]["function"]


MUTATIONS = {
    "changed-argument": _changed_argument,
    # one character of a value, and whitespace no reading of the value's text gives (" 1+2" for "\n1+2\n")
    "changed-value": _edited_value(lambda v: v[:-1] + chr(ord(v[-1]) + 1)),
    "value-spaced": _edited_value(lambda v: " " + v),
    "dropped-call": _dropped_call,
    "swapped-calls": _swapped_calls,
}


def mutation_results(b: Built) -> dict[str, bool | str]:
    """Per mutation: reported in the call turn (True/False), or why it cannot apply; ``clean`` False where the
    unmutated rollout already has a defect (the mutations then prove nothing)."""
    several = b.reader.form.several
    drawn = EXAMPLE_CALLS if several else EXAMPLE_CALLS[:1]
    text = rendered_turn(b.renderer, b.profile, assistant_message(b.profile, drawn))
    lr, rollout = loop_rollout(b, [text], ["3", "4"])
    checker = ConsistencyChecker(b.renderer, b.profile, CheckPolicy(mode="warn"))
    clean = checker.check_rollout(rollout, template_view=True)
    out: dict[str, bool | str] = {"clean": clean.ok and clean.engine_ok and read_calls(lr) == [drawn]}
    at = next(i for i, m in enumerate(rollout.messages) if m["role"] == "assistant")
    for name, mutate in MUTATIONS.items():
        if name in ("dropped-call", "swapped-calls") and not several:
            out[name] = "the template renders one call per turn"
            continue
        messages = copy.deepcopy([dict(m) for m in rollout.messages])
        mutate(messages[at]["tool_calls"])
        result = checker.check_rollout(dataclasses.replace(rollout, messages=tuple(messages)), template_view=True)
        out[name] = bool(result.engine_failures) or any(f.turn == 0 for f in result.findings if not f.allowed)
    return out


# Failures found by these tests, of classes other changes of issue 37 are fixing: (test, variant name) -> the class
# and its owner. Each is a strict xfail: when the fix lands the test XPASSes and the entry goes.
KNOWN_FAILURES: dict[tuple[str, str], str] = {}


def params(test: str) -> list[Any]:
    """The sampled variants for ``test``, the known failures marked."""
    out = []
    for v in sampled_variants():
        reason = KNOWN_FAILURES.get((test, v.name))
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        out.append(pytest.param(v, id=v.name, marks=marks))
    return out


def _built_or_skip(variant: Variant) -> Built:
    b = built(variant)
    if isinstance(b, str):
        pytest.skip(f"{variant.name}: {b}")
    return b


def _property(b: Built, inside: bool, examples: int) -> None:
    checker = ConsistencyChecker(b.renderer, b.profile, CheckPolicy(mode="warn"))

    # no shrinking: a failing variant's first example is its reproducer, and shrinking one costs minutes here
    @settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def holds(data):
        o = one_rollout(data, b, checker, inside)
        assert not o.defects, (o.text, o.defects)
        assert not o.misread or o.ambiguous, (o.text, o.misread)
        assert not o.left, (o.text, o.left)

    holds()


@pytest.mark.parametrize("variant", params("spacing"))
def test_calls_as_models_write_them(variant):
    _property(_built_or_skip(variant), inside=False, examples=3)


@pytest.mark.parametrize("variant", params("markers-in-strings"))
def test_marker_text_inside_arguments(variant):
    _property(_built_or_skip(variant), inside=True, examples=2)


@pytest.mark.parametrize("variant", params("mutations"))
def test_mutations_caught_in_their_turn(variant):
    results = mutation_results(_built_or_skip(variant))
    assert results.pop("clean"), f"{variant.name}: the unmutated rollout is not clean"
    missed = [name for name, caught in results.items() if caught is False]
    assert not missed, f"{variant.name}: not reported in the call turn: {missed}"


def test_the_generator_covers_every_edit_class_and_both_kinds():
    """Every edit class yields kept variants on both tokenizer kinds, and a variant not kept says why."""
    every = all_variants(SUITE_CASES)
    kept = [v for v, why in every if not why]
    # no-space-after-last applies to none of these templates (none writes whitespace right after its last marker in
    # the same literal: Qwen's newline after <|im_end|> is its own literal); the bench shows where each applies
    applied = set(EDITS) - {"no-space-after-last"}
    for edit in applied:
        assert {v.kind for v in kept if v.edit == edit} == {"special", "plain"}, edit
    assert all(why for v, why in every if v not in kept)


def test_the_plain_kind_writes_call_markers_as_text():
    """The plain kind's tokenizer splits a call marker into several tokens; the special kind's holds it as one."""
    kept = [v for v, why in all_variants(SUITE_CASES) if not why and v.template == "qwen3" and v.edit == "original"]
    by_kind = {v.kind: built(v) for v in kept}
    for kind, b in by_kind.items():
        assert not isinstance(b, str), b
        ids = b.renderer.encode("<tool_call>")
        assert (len(ids) == 1) is (kind == "special"), (kind, ids)


def test_a_misreading_reader_is_caught_by_the_property():
    """The property's own checks can fail: a reader that changes an argument is a misread call, and the check's
    defect, in the rollouts ``one_rollout`` builds (the derived reader alone, as where verl has no parser)."""
    (variant,) = [v for v, why in all_variants(SUITE_CASES) if v.name == "qwen3:original:special"]
    b = _built_or_skip(variant)
    bad = dataclasses.replace(
        b, variant=dataclasses.replace(variant, edit="misreading-reader"), reader=ChangesArguments(b.reader.form)
    )
    _PARSERS[bad.variant.name] = None  # the derived reader alone reads the turns
    checker = ConsistencyChecker(b.renderer, b.profile, CheckPolicy(mode="warn"))

    @settings(max_examples=2, deadline=None, derandomize=True, phases=[Phase.generate], database=None)
    @given(st.data())
    def caught(data):
        o = one_rollout(data, bad, checker, inside=False)
        assert o.misread and o.defects and not o.ambiguous, o

    caught()


def test_an_ambiguous_render_is_proven_by_rendering_both_calls():
    """A keyed value holding the template's own text between two parameters renders as the call with the two values
    (``same_render``: ambiguous, no reader can tell them apart); the close without the template's whitespace
    (``"a </parameter><parameter=b>c"``) renders otherwise, and so does a changed value: neither is ambiguous."""
    coder = "qwen3/qwen3-coder-30b-a3b-instruct_ollama-gguf:original:special"
    (variant,) = [v for v, why in all_variants(SUITE_CASES) if v.name == coder]
    b = _built_or_skip(variant)
    drawn = [("calculator", {"expression": ambiguous_text(b)})]
    message = assistant_message(b.profile, drawn)
    assert same_render(b, message, [("calculator", {"expression": "a", "expression2": "5"})])
    assert not same_render(b, message, [("calculator", {"expression": "a", "expression2": "6"})])
    spaced = assistant_message(b.profile, [("calculator", {"expression": "a </parameter><parameter=b>c"})])
    assert not same_render(b, spaced, [("calculator", {"expression": "a ", "b": "c"})])
