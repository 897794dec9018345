"""``parse_turn`` decides between verl's parser and the derived reader by fault class (``call_reader.faults``).

Each class is tested in both orders, with verl's real parsers on the fixture templates that write calls in them:
verl's reading faulty and the derived one right (the derived reading taken), then the derived reader injected with
the same class of fault while verl's reads right (verl's taken). Either way the turn is marked ``disagree``, the
loop counts it in ``tito/tool/readings_disagree``, and the turn names the losing reading's faults. Classes:

- a name not offered and not written where the form writes names: verl's kimi parser reads the id
  ``functions.get-weather:0`` as the name of a hyphenated tool;
- arguments not written: verl's kimi parser cuts a call at a ``<|tool_call_end|>`` inside a JSON string and reads
  the arguments as ``{}``;
- arguments not of their declared types: verl's seed parser keeps the template's ``True``, ``None`` and Python
  lists as strings;
- keyed values not written: verl's qwen3_coder parser ends a value at a ``</function>``, ``</tool_call>`` or
  ``</parameter>`` inside it (``call_reader.keyed``: a value ends where the form goes on after its close, a string
  with the template's whitespace around it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from call_reader_cases import TOOLS, ChangesArguments, assistant_message, rendered_turn
from loop_rollouts import parse_text, tool_schemas
from template_fixtures import template_renderer

from verl_ext.core.call_reader import CallReader, ReadCall, ReadTurn, learn_call_reader, parameter_types
from verl_ext.core.call_reader.faults import (
    NAME_NOT_OFFERED,
    NOT_WRITTEN,
    TYPE_MISFIT,
    call_faults,
)
from verl_ext.core.probe import probe_template
from verl_ext.core.turn_end import end_of_turn_ids
from verl_ext.core.turn_parse import ParsedTurn


def _parts(template: str, fmt: str) -> dict[str, Any]:
    from verl.experimental.agent_loop.tool_parser import ToolParser

    r = template_renderer(template)
    profile = probe_template(r)
    reader = learn_call_reader(r, profile).reader
    assert reader is not None
    return {"r": r, "profile": profile, "parser": ToolParser.get_tool_parser(fmt, r.tokenizer), "reader": reader}


@pytest.fixture(scope="module")
def kimi() -> dict[str, Any]:
    return _parts("moonshotai-Kimi-K2", "kimi")


@pytest.fixture(scope="module")
def seed() -> dict[str, Any]:
    return _parts("ByteDance-Seed-OSS", "seed")


def text_of(parts: dict[str, Any], calls: list[tuple[str, dict[str, Any]]]) -> str:
    """The template's own text for a turn of ``calls``."""
    text = rendered_turn(parts["r"], parts["profile"], assistant_message(parts["profile"], calls))
    assert text, calls
    return text


def read(parts: dict[str, Any], text: str, reader: Any = "derived") -> ParsedTurn:
    return parse_text(parts, text, TOOLS, reader)


def calls_of(turn: ParsedTurn) -> list[tuple[str, Any]]:
    return [(c.name, json.loads(c.arguments)) for c in turn.calls]


HYPHENATED = [("get-weather", {"expression": "Paris"}), ("calculator", {"expression": "1+2"})]
MARKER_IN_STRING = [("calculator", {"expression": "1+2"}), ("web_search", {"expression": "a <|tool_call_end|> b"})]
TYPED = [("calculator", {"expression": "a", "exact": True, "tags": ["x", 1], "filters": {"a": "b"}, "count": 3})]


def test_verls_kimi_parser_reads_an_id_as_a_hyphenated_name_and_the_derived_reading_is_taken(kimi):
    text = text_of(kimi, HYPHENATED)
    alone = read(kimi, text, reader=None)
    assert [c.name for c in alone.calls] == ["functions.get-weather:0", "calculator"], alone  # verl's misreading
    turn = read(kimi, text)
    assert calls_of(turn) == HYPHENATED and turn.derived and turn.disagree, turn
    assert {NAME_NOT_OFFERED, NOT_WRITTEN} <= set(turn.faults), turn.faults
    assert [c["function"]["name"] for c in turn.message["tool_calls"]] == ["get-weather", "calculator"]


def test_verls_kimi_parser_cuts_a_call_at_a_marker_inside_a_string_and_the_derived_reading_is_taken(kimi):
    text = text_of(kimi, MARKER_IN_STRING)
    alone = read(kimi, text, reader=None)
    assert calls_of(alone) == [MARKER_IN_STRING[0], ("web_search", {})], alone  # verl's: arguments {}
    turn = read(kimi, text)
    assert calls_of(turn) == MARKER_IN_STRING and turn.derived and turn.disagree, turn
    assert turn.faults == (NOT_WRITTEN,), turn.faults


def test_verls_seed_parser_keeps_typed_values_as_strings_and_the_derived_reading_is_taken(seed):
    text = text_of(seed, TYPED)
    alone = read(seed, text, reader=None)
    assert calls_of(alone)[0][1]["exact"] == "True" and calls_of(alone)[0][1]["tags"] == "['x', 1]", alone
    turn = read(seed, text)
    assert calls_of(turn) == TYPED and turn.derived and turn.disagree, turn
    assert turn.faults == (TYPE_MISFIT,), turn.faults


class _Renames(CallReader):
    """A derived reader that reads the calls, then names the first ``to`` (the injected misreading)."""

    to = "functions.get-weather:0"

    def read(self, text: str, types: Any = None) -> ReadTurn:
        turn = super().read(text, types)
        first = turn.calls[0]
        return dataclasses.replace(turn, calls=(ReadCall(self.to, first.arguments, first.call_id), *turn.calls[1:]))


class _RenamesOffered(_Renames):
    to = "web_search"  # offered, but not the name written


class _Stringifies(CallReader):
    """A derived reader that reads the calls, then keeps the first call's values as the template's text."""

    def read(self, text: str, types: Any = None) -> ReadTurn:
        turn = super().read(text, types)
        first = turn.calls[0]
        values = {k: v if isinstance(v, str) else str(v) for k, v in json.loads(first.arguments).items()}
        return dataclasses.replace(turn, calls=(ReadCall(first.name, json.dumps(values), first.call_id),))


@pytest.mark.parametrize(
    ("misreads", "faults"),
    [
        (_Renames, {NAME_NOT_OFFERED, NOT_WRITTEN}),
        (_RenamesOffered, {NOT_WRITTEN}),
        (ChangesArguments, {NOT_WRITTEN}),
    ],
)
def test_verls_kimi_reading_is_taken_where_the_derived_reader_misreads(kimi, misreads, faults):
    calls = [("calculator", {"expression": "1+2"}), ("web_search", {"expression": "Paris"})]
    turn = read(kimi, text_of(kimi, calls), reader=misreads(kimi["reader"].form))
    assert calls_of(turn) == calls and not turn.derived and turn.disagree, turn
    assert set(turn.faults) == faults, turn.faults


def test_verls_seed_reading_is_taken_where_the_derived_reader_misreads_types(seed):
    calls = [("calculator", {"expression": "a", "count": 3})]
    turn = read(seed, text_of(seed, calls), reader=_Stringifies(seed["reader"].form))
    assert calls_of(turn) == calls and not turn.derived and turn.disagree, turn
    assert turn.faults == (TYPE_MISFIT,), turn.faults


def test_readings_that_agree_are_no_disagreement(kimi, seed):
    for parts, calls in ((kimi, [("calculator", {"expression": "1+2"})]), (seed, [("calculator", {"count": 3})])):
        turn = read(parts, text_of(parts, calls))
        assert calls_of(turn) == calls and not turn.disagree and not turn.faults, turn


def test_each_class_alone(kimi):
    """Each fault class is a fact of its own: a name not offered and not written (a tool not offered that the model
    called is no fault), a call not written, a value kept as text that is a value of its declared type; a null fits
    any type (a parameter left unset), a value the model wrote of another type is no fault, and no tools offered
    judge no name or type."""
    reader, types = kimi["reader"], parameter_types(tool_schemas(TOOLS))
    text = text_of(kimi, [("calculator", {"expression": "1+2", "note": None})])
    assert call_faults(reader, text, [("calculator", '{"expression": "1+2", "note": null}')], types) == frozenset()
    lookup = [("lookup", '{"expression": "1+2", "note": null}')]
    assert call_faults(reader, text, lookup, types) == {NAME_NOT_OFFERED, NOT_WRITTEN}  # a name the reading made up
    assert call_faults(reader, text.replace("calculator", "lookup"), lookup, types) == frozenset()  # the model's
    assert call_faults(reader, text, lookup, {}) == {NOT_WRITTEN}
    assert call_faults(reader, text, [("calculator", '{"expression": "1+3", "note": null}')], types) == {NOT_WRITTEN}
    assert call_faults(reader, text, [("calculator", "not json")], types) == {NOT_WRITTEN}
    as_text = text_of(kimi, [("calculator", {"count": "3", "exact": "True", "tags": "['x']"})])
    for kept in ('{"count": "3"}', '{"exact": "true"}', '{"tags": "[\'x\']"}'):
        written = text_of(kimi, [("calculator", json.loads(kept))])
        assert call_faults(reader, written, [("calculator", kept)], types) == {TYPE_MISFIT}, kept
    assert call_faults(reader, as_text, [("calculator", '{"count": "3"}')], {}) == {NOT_WRITTEN}
    # a value the model wrote of another type than declared is what it wrote: no fault
    other = text_of(kimi, [("calculator", {"expression": 3, "count": "many"})])
    assert call_faults(reader, other, [("calculator", '{"expression": 3, "count": "many"}')], types) == frozenset()


def _loop_counters(parts: dict[str, Any], text: str) -> Counter[str]:
    """What ``verl_ext_tool_agent``'s parse step counts for one turn (its own ``_parse``, over the runtime's parts)."""
    from verl_ext.plugin.agent_loop import VerlExtToolAgentLoop

    r, profile = parts["r"], parts["profile"]
    runtime = SimpleNamespace(
        end_of_turn_ids=end_of_turn_ids(profile), renderer=r, profile=profile, call_reader=parts["reader"]
    )
    schemas = zip(TOOLS, tool_schemas(TOOLS), strict=True)
    active = {t["function"]["name"]: SimpleNamespace(tool_schema=s) for t, s in schemas}
    loop = SimpleNamespace(tool_parser=parts["parser"], rt=runtime, max_parallel_calls=8)
    counters: Counter[str] = Counter()
    ids = [*r.encode(text), min(profile.close_id_set)]
    asyncio.run(VerlExtToolAgentLoop._parse(loop, ids, 0, counters, active))  # type: ignore[arg-type]
    return counters


def test_the_loop_counts_the_disagreements_of_each_class(kimi, seed):
    for parts, calls in ((kimi, HYPHENATED), (kimi, MARKER_IN_STRING), (seed, TYPED)):
        counters = _loop_counters(parts, text_of(parts, calls))
        assert counters["tool/readings_disagree"] == 1 and counters["tool/derived_reads"] == 1, (calls, counters)
    assert _loop_counters(kimi, text_of(kimi, [("calculator", {"expression": "1+2"})]))["tool/readings_disagree"] == 0


def test_a_tag_right_before_a_call_stays_in_the_content(seed):
    """Seed-OSS writes its reasoning block right before the call (``</seed:think><seed:tool_call>``); the '>' its
    form writes after a name is no header chunk of the call, so the block's '>' stays in the content."""
    message = assistant_message(seed["profile"], [("calculator", {"expression": "a"})])
    message["reasoning_content"] = "I need the calculator."
    text = rendered_turn(seed["r"], seed["profile"], message)
    assert text and "</seed:think><seed:tool_call>" in text.replace("\n", ""), text
    turn = seed["reader"].read(text)
    assert turn.content.rstrip().endswith("</seed:think>"), turn.content


@pytest.fixture(scope="module")
def coder() -> dict[str, Any]:
    """Qwen3-Coder's template (keyed XML parameters) with verl's qwen3_coder parser."""
    from call_reader_cases import case_renderer
    from verl.experimental.agent_loop.tool_parser import ToolParser

    r = case_renderer("qwen3/qwen3-coder-30b-a3b-instruct_ollama-gguf")
    profile = probe_template(r)
    reader = learn_call_reader(r, profile).reader
    assert reader is not None
    parser = ToolParser.get_tool_parser("qwen3_coder", r.tokenizer)
    return {"r": r, "profile": profile, "parser": parser, "reader": reader}


# a keyed value holding call-marker text: verl's qwen3_coder parser ends the value (and the call) at the marker
KEYED_MARKERS = [
    [("calculator", {"expression": "see </function> here", "count": 3})],
    [("calculator", {"expression": "see </tool_call> here"}), ("web_search", {"expression": "Paris"})],
    [("calculator", {"expression": "see </parameter> here", "count": 3})],
]


@pytest.mark.parametrize("calls", KEYED_MARKERS, ids=["function", "tool_call", "parameter"])
def test_verls_qwen3_coder_parser_cuts_a_value_at_a_marker_inside_it_and_the_derived_reading_is_taken(coder, calls):
    text = text_of(coder, calls)
    alone = read(coder, text, reader=None)
    assert calls_of(alone) != calls, alone  # verl's: the value cut at the marker
    turn = read(coder, text)
    assert calls_of(turn) == calls and turn.derived and turn.disagree, turn
    assert turn.faults == (NOT_WRITTEN,), turn.faults
    counters = _loop_counters(coder, text)
    assert counters["tool/readings_disagree"] == 1 and counters["tool/derived_reads"] == 1, counters


def test_verls_qwen3_coder_reading_is_taken_where_the_derived_reader_misreads(coder):
    calls = [("calculator", {"expression": "1+2", "count": 3})]
    turn = read(coder, text_of(coder, calls), reader=ChangesArguments(coder["reader"].form))
    assert calls_of(turn) == calls and not turn.derived and turn.disagree, turn
    assert turn.faults == (NOT_WRITTEN,), turn.faults
    assert _loop_counters(coder, text_of(coder, calls))["tool/readings_disagree"] == 0


def test_a_keyed_call_is_written_only_as_the_template_writes_its_values(coder):
    """``keyed_writes``: the values of some cut of the text at the closes the form goes on after; a string with the
    template's whitespace around it (a value cut at a marker inside it, or respaced, is not the text's)."""
    reader, types = coder["reader"], parameter_types(tool_schemas(TOOLS))
    text = text_of(coder, KEYED_MARKERS[0])
    assert call_faults(reader, text, [("calculator", json.dumps(KEYED_MARKERS[0][0][1]))], types) == frozenset()
    for wrong in ({"expression": "see ", "count": 3}, {"expression": " see </function> here", "count": 3}, {}):
        assert call_faults(reader, text, [("calculator", json.dumps(wrong))], types) == {NOT_WRITTEN}, wrong
