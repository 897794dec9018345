"""The tool-call comparison on text: the same calls written otherwise hold; a changed value, a dropped call, two
calls swapped do not; a call no parser reads is a malformed block. (End to end on real templates and verl's parsers:
``test_loop_output_property.py``, ``test_mutations.py``.)"""

from __future__ import annotations

import re

import pytest

from verl_ext.check.tool_call_compare import (
    call_markers,
    read_calls,
    same_value,
    without_blocks,
    without_python_calls,
)

STRUCTURE = re.compile(r"</?tool_call>|</?seed:tool_call>")
HERMES = ("<tool_call>", "</tool_call>")
SEED = ("<seed:tool_call>", "</seed:tool_call>")


def call(name: str, **arguments: object) -> dict:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}


def hermes(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


RENDERED = hermes("calc", '{"k": 100.0}') + "\n" + hermes("search", '{"q": "café"}')


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        (100.0, 100, True),
        (-0.0, 0, True),
        (2.5, 2.50, True),
        (True, 1, False),
        (None, "null", False),
        ({"a": 1, "b": [1, 2.0]}, {"b": [1, 2], "a": 1.0}, True),
        ("café", "cafe", False),
        ([1, 2], [2, 1], False),
    ],
)
def test_values_compare_by_meaning(a, b, same):
    assert same_value(a, b) is same


def test_the_markers_are_read_from_a_rendering_of_two_calls():
    assert call_markers(RENDERED, ["calc", "search"], STRUCTURE) == HERMES
    assert call_markers(RENDERED, ["calc", "search", "x"], STRUCTURE) is None  # no text written once per call
    assert call_markers(RENDERED, ["calc"], None) is None
    assert call_markers(RENDERED, ["calc", "search"], STRUCTURE, ["k"]) == HERMES  # the arguments lie inside


def test_a_closer_before_the_arguments_is_no_call_marker():
    """Mistral Small 3.2 writes ``[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}`` per call, no control text after the
    arguments: ``[ARGS]`` as the closer cut every call off its arguments, so no call was ever held there (a hermes call
    its parser read, after a call in the template's own format, was reported as ``message_differs``)."""
    structure = re.compile(r"\[TOOL_CALLS\]|\[CALL_ID\]|\[ARGS\]")
    rendered = '[TOOL_CALLS]calc[CALL_ID]c1[ARGS]{"k": 1}[TOOL_CALLS]search[CALL_ID]c2[ARGS]{"k": 1}</s>'
    assert call_markers(rendered, ["calc", "search"], structure) == ("[TOOL_CALLS]", "[ARGS]")  # the name alone
    assert call_markers(rendered, ["calc", "search"], structure, ["k"]) is None


@pytest.mark.parametrize(
    "sampled",
    [
        '<tool_call> {"arguments":{"k":1e2},"name":"calc"} </tool_call><tool_call>{"name":"search","arguments":'
        '{"q":"caf\\u00e9"}}</tool_call>',
        'Let me see.\n<tool_call>{"name": "calc", "arguments": {"k": 100}}</tool_call>\n\n<tool_call>\n'
        '{"name": "search", "arguments": "{\\"q\\": \\"café\\"}"}\n</tool_call>',
    ],
)
def test_the_same_calls_written_otherwise_hold(sampled):
    reading = read_calls(sampled, RENDERED, [call("calc", k=100.0), call("search", q="café")], HERMES)
    assert reading is not None and reading.holds, reading
    assert [b.call for b in reading.sampled] == [0, 1]


@pytest.mark.parametrize(
    ("sampled", "problem"),
    [
        (hermes("calc", '{"k": 99}') + hermes("search", '{"q": "café"}'), "tool call 1"),  # a value changed
        (hermes("search", '{"q": "café"}') + hermes("calc", '{"k": 1e2}'), "tool call 2"),  # two calls swapped
        (hermes("calc", '{"k": 1e2}') + hermes("search", '{"q": "café"}') + hermes("x", "{}"), "does not hold"),
    ],
)
def test_a_changed_swapped_or_dropped_call_does_not_hold(sampled, problem):
    reading = read_calls(sampled, RENDERED, [call("calc", k=100.0), call("search", q="café")], HERMES)
    assert reading is not None and not reading.holds and problem in reading.detail, reading


def test_a_call_no_parser_reads_is_a_malformed_block_and_text_around_it_stays():
    bad = '<tool_call>\n{"name": "calc", "parameters": {"k": 1}}\n</tool_call>'
    broken = '<tool_call>\n{"name": "calc", "arguments": {"k": 1}\n</tool_call>'
    good = hermes("calc", '{"k": 1e2}')
    sampled = f"Hi {bad} {good} {broken} bye"
    reading = read_calls(sampled, hermes("calc", '{"k": 100.0}'), [call("calc", k=100.0)], HERMES)
    assert reading is not None and reading.holds, reading
    assert [(b.call, b.malformed) for b in reading.sampled] == [(None, True), (0, False), (None, True)]
    assert without_blocks(sampled, reading.sampled).split() == ["Hi", "bye"]


def test_xml_parameters_compare_raw_text_and_by_value():
    rendered = "<seed:tool_call>\n<function=calc>\n<parameter=k>2.5</parameter>\n</function>\n</seed:tool_call>"
    sampled = "<seed:tool_call><function=calc><parameter=k>2.50</parameter></function></seed:tool_call>"
    assert read_calls(sampled, rendered, [call("calc", k=2.5)], SEED).holds
    assert not read_calls(sampled, rendered, [call("calc", k=2.4)], SEED).holds
    headless = "<seed:tool_call><parameter=k>1</parameter></function></seed:tool_call>"
    reading = read_calls(headless + sampled, rendered, [call("calc", k=2.5)], SEED)
    assert reading.holds and reading.sampled[0].malformed  # no function header: no parser reads it
    other = "<seed:tool_call><function=other><parameter=k>1</parameter></function></seed:tool_call>"
    assert not read_calls(other + sampled, rendered, [call("calc", k=2.5)], SEED).holds  # a call the message lacks


def test_an_xml_value_cut_by_the_response_length_holds_the_text_sampled():
    """qwen3_coder reads an unclosed parameter to the end of the text: a turn cut inside ``</parameter>`` holds the
    value with the cut marker's text, as sampled; any other value is still not held."""
    rendered = "<tool_call>\n<function=calc>\n<parameter=k>\n1+2\n</parameter\n</parameter>\n</function>\n</tool_call>"
    sampled = "<tool_call>\n<function=calc>\n<parameter=k>\n1+2\n</parameter"
    markers = ("<tool_call>", "</tool_call>")
    assert read_calls(sampled, rendered, [call("calc", k="1+2\n</parameter")], markers).holds
    assert read_calls(sampled, rendered, [call("calc", k="1+2")], markers).holds  # the value before the cut marker
    assert not read_calls(sampled, rendered, [call("calc", k="1+2\n</param")], markers).holds
    assert not read_calls(sampled, rendered, [call("calc", k="1+3\n</parameter")], markers).holds


def test_an_xml_value_holding_tag_text_holds_it_as_sampled():
    """A raw XML value cannot escape a tag inside it: ``see <b>x</b> here`` is the value as sampled (on real turns the
    derived reader's blocks keep a call marker inside a value too: ``test_template_variants``)."""
    rendered = "<seed:tool_call><function=calc><parameter=k>see <b>x</b> here</parameter></function></seed:tool_call>"
    sampled = "<seed:tool_call><function=calc>\n<parameter=k>see <b>x</b> here</parameter></function></seed:tool_call>"
    assert read_calls(sampled, rendered, [call("calc", k="see <b>x</b> here")], SEED).holds
    assert not read_calls(sampled, rendered, [call("calc", k="see <b>x</b> there")], SEED).holds
    assert not read_calls(sampled, rendered, [call("calc", k="see <b>x</b>")], SEED).holds


@pytest.mark.parametrize(
    "sampled",
    [
        "<|python_tag|>brave_search.call(query='a b', n=1e2, ok=True)",
        '<|python_tag|> brave_search.call( query = "a b" , n = 100 , ok = True , )',
        "<|python_tag|>brave_search.call(ok=True, n=100.0, query='a b')",
    ],
)
def test_python_calls_held_by_value_are_cut_from_both_texts(sampled: str) -> None:
    rendered = '<|python_tag|>brave_search.call(query="a b", n=100, ok=True)'
    assert without_python_calls(sampled, rendered)[1] == "<|python_tag|>"
    assert without_python_calls(sampled, rendered)[0].strip() == "<|python_tag|>"


@pytest.mark.parametrize(
    "rendered",
    [
        '<|python_tag|>brave_search.call(query="a c")',  # another value
        '<|python_tag|>wolfram_alpha.call(query="a b")',  # another tool
        '<|python_tag|>brave_search.call(query="a b", n=1)',  # an argument the model did not write
        "<|python_tag|>brave_search.call(query=1)",  # a number where the model wrote a string
    ],
)
def test_python_calls_not_sampled_stay_for_the_verdict(rendered: str) -> None:
    sampled = "<|python_tag|>brave_search.call(query='a b')"
    assert without_python_calls(sampled, rendered) == (sampled, rendered)
