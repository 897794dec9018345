"""Keyed XML parameters (``call_reader.keyed``) read on Qwen3-Coder's real template and the shipped Qwen3 tokenizer:
text a model writes inside a call that is no parameter is never dropped, and ``keyed_writes`` agrees with the read.

- stray text after the last parameter's close (``...\\n3\\n</parameter>\\nXYZ\\n</function>``) or before the first
  parameter: the call is not the form's, so the derived reader counts it malformed and keeps its text in the
  content; verl's qwen3_coder parser reads its parameters and drops the text, and that reading is ``NOT_WRITTEN``,
  so the loop takes the derived reading (the text stays in the message);
- stray text between two parameters: the close before it is the preceding value's text (the module's rule), so the
  text is in that value;
- a value holding more closes the form goes on after than the 64 cuts ``keyed_writes`` used to enumerate is judged
  exactly, one step a parameter (a false ``NOT_WRITTEN`` before);
- a property over calls drawn with stray text between, before and after parameters and values holding close-marker
  text: nothing the reader does not read as a call leaves the content, no call-marker text is left outside the
  calls, every call read is written, and the loop's reading keeps every stray text;
- mutations: the check that the form goes on after a call's parameters removed, the unread section's whole trail
  not looked for: each caught.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from call_reader_cases import TOOLS, assistant_message, case_renderer, rendered_turn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from loop_rollouts import parse_text, tool_schemas

from verl_ext.core.call_reader import keyed, learn_call_reader, parameter_types
from verl_ext.core.call_reader.faults import NOT_WRITTEN, call_faults
from verl_ext.core.call_reader.keyed import KeyedValues, keyed_writes
from verl_ext.core.call_reader.leftover import call_text_left, outside
from verl_ext.core.probe import probe_template

CODER = "qwen3/qwen3-coder-30b-a3b-instruct_ollama-gguf"
TYPES = parameter_types(tool_schemas(TOOLS))
ONE = [("calculator", {"expression": "1+2", "count": 3})]


@pytest.fixture(scope="module")
def coder() -> dict[str, Any]:
    from verl.experimental.agent_loop.tool_parser import ToolParser

    r = case_renderer(CODER)
    profile = probe_template(r)
    reader = learn_call_reader(r, profile).reader
    assert reader is not None
    return {
        "r": r,
        "profile": profile,
        "reader": reader,
        "parser": ToolParser.get_tool_parser("qwen3_coder", r.tokenizer),
    }


def text_of(coder: dict[str, Any], calls: list[tuple[str, dict[str, Any]]]) -> str:
    text = rendered_turn(coder["r"], coder["profile"], assistant_message(coder["profile"], calls))
    assert text, calls
    return text


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


def _kept(piece: str, content: str, arguments: list[Any]) -> bool:
    return piece in content or any(piece in s for a in arguments for s in _strings(a))


def assert_nothing_lost(coder: dict[str, Any], text: str, strays: list[str]) -> None:
    """The derived reading of ``text`` and the loop's: what is outside the calls is the content, no call-marker text
    is left outside them (unread sections aside), each call read is written (``keyed_writes``), and each of
    ``strays`` is in the content or in a value, in both readings."""
    reader = coder["reader"]
    turn = reader.read(text, TYPES)
    assert "".join(outside(text, turn.spans).split()) == "".join(turn.content.split()), (text, turn)
    rest = turn.content
    for a, b, closed in turn.unread:
        if closed:
            rest = rest.replace(text[a:b], "", 1)
    assert call_text_left(reader.form, rest) is None, (text, turn)
    for c in turn.calls:
        assert NOT_WRITTEN not in call_faults(reader, text, [(c.name, c.arguments)], TYPES), (text, c)
    derived = [json.loads(c.arguments) for c in turn.calls]
    loop = parse_text(coder, text, TOOLS)
    taken = [c["function"]["arguments"] for c in loop.message.get("tool_calls", [])]
    for piece in strays:
        assert _kept(piece, turn.content, derived), (piece, text, turn)
        assert _kept(piece, loop.message["content"], taken), (piece, text, loop)


def test_stray_text_after_the_last_parameter_is_a_malformed_call_kept_in_the_content(coder):
    text = text_of(coder, ONE).replace("3\n</parameter>\n", "3\n</parameter>\nXYZ\n")
    turn = coder["reader"].read(text, TYPES)
    assert (turn.calls, turn.malformed, turn.content) == ((), 1, text), turn
    verl = parse_text(coder, text, TOOLS, reader=None)
    assert [json.loads(c.arguments) for c in verl.calls] == [ONE[0][1]] and "XYZ" not in verl.message["content"]
    # verl's reading drops XYZ: no cut of the text gives it, so the loop takes the derived reading
    assert call_faults(coder["reader"], text, [(c.name, c.arguments) for c in verl.calls], TYPES) == {NOT_WRITTEN}
    loop = parse_text(coder, text, TOOLS)
    assert loop.message["content"] == text and not loop.calls and loop.malformed == 1 and loop.disagree, loop
    assert_nothing_lost(coder, text, ["XYZ"])


def test_stray_text_before_the_first_parameter_is_a_malformed_call_kept_in_the_content(coder):
    text = text_of(coder, ONE).replace("<function=calculator>\n", "<function=calculator>\nXYZ\n")
    turn = coder["reader"].read(text, TYPES)
    assert (turn.calls, turn.malformed, turn.content) == ((), 1, text), turn
    assert not keyed_writes(coder["reader"].values, text, text.index("XYZ") - 1, {})  # no cut gives any call
    assert_nothing_lost(coder, text, ["XYZ"])


def test_stray_text_between_parameters_is_the_preceding_values_text(coder):
    text = text_of(coder, ONE).replace("1+2\n</parameter>\n", "1+2\n</parameter>\nXYZ\n")
    turn = coder["reader"].read(text, TYPES)
    assert [json.loads(c.arguments) for c in turn.calls] == [
        {"expression": "1+2\n</parameter>\nXYZ\n<parameter=count>\n3"}
    ]
    assert turn.malformed == 0 and turn.content == "", turn
    assert_nothing_lost(coder, text, ["XYZ"])


def test_a_stray_call_among_good_ones_leaves_the_good_ones_read(coder):
    calls = [("calculator", {"expression": "1+2"}), ("web_search", {"expression": "Paris", "count": 7})]
    text = text_of(coder, calls).replace("7\n</parameter>\n", "7\n</parameter>\nXYZ\n")
    turn = coder["reader"].read(text, TYPES)
    assert [(c.name, json.loads(c.arguments)) for c in turn.calls] == calls[:1] and turn.malformed == 1, turn
    assert turn.content.strip().startswith("<tool_call>\n<function=web_search>") and "XYZ" in turn.content
    assert_nothing_lost(coder, text, ["XYZ"])


# A value's own text holding closes the form goes on after: each one a place a cut may end the value.
PIECES = {"head": "</parameter><parameter=b>", "trail": "</parameter>\n</function>\n</tool_call>\n"}


class _Counted(KeyedValues):
    """``KeyedValues`` counting the value texts it compares (the work ``keyed_writes`` does)."""

    compared = 0

    def written(self, raw: str | None, value: Any) -> bool:
        type(self).compared += 1
        return super().written(raw, value)


@pytest.mark.parametrize("piece", sorted(PIECES))
@pytest.mark.parametrize("closes", [100, 1000])
def test_a_value_holding_many_closes_is_judged_exactly_one_step_a_parameter(coder, piece, closes):
    """More closes the form goes on after than the 64 cuts ``keyed_writes`` tried before (it judged the call not
    written): the written arguments are written, changed ones are not, a comparison or two a parameter. In a string,
    and in a list's string (the template writes it with ``|string``: a Python literal)."""
    many = "v" + PIECES[piece] * closes + "w"
    values = _Counted(coder["reader"].form)
    for arguments in ({"expression": many, "count": 3}, {"count": 3, "tags": [many], "exact": True}):
        text = text_of(coder, [("calculator", arguments)])
        at = text.index("<function=calculator>") + len("<function=calculator>")
        _Counted.compared = 0
        assert keyed_writes(values, text, at, arguments)
        assert _Counted.compared <= 2 * len(arguments), _Counted.compared  # no scan of the closes' cuts
        for changed in ({**arguments, "count": 4}, {**arguments, "exact": False}, {"count": 3}, {"tags": ["v"]}):
            _Counted.compared = 0
            assert not keyed_writes(values, text, at, changed), changed
            assert _Counted.compared <= 2 * len(arguments), (changed, _Counted.compared)


def test_a_python_comment_may_hold_a_close_and_both_cuts_are_written(coder):
    """The template writes non-strings with ``|string`` and verl's parser reads them with ``ast.literal_eval``, which
    takes a comment: ``3 # x</parameter><parameter=b>5`` on one line reads as 3 cut at either close."""
    values = coder["reader"].values
    text = "<function=calculator>\n<parameter=count>\n3 # x</parameter><parameter=b>5</parameter>\n"
    text += "</function>\n</tool_call>"
    at = len("<function=calculator>")
    assert keyed_writes(values, text, at, {"count": 3}) and keyed_writes(values, text, at, {"count": 3, "b": 5})
    assert not keyed_writes(values, text, at, {"count": 3, "b": 6})


def test_a_key_written_twice_is_a_malformed_call_kept_in_the_content(coder):
    """One reading of ``a`` twice would drop a value the model wrote (verl's parser keeps the last)."""
    text = text_of(coder, ONE).replace(
        "<parameter=count>", "<parameter=expression>\n4\n</parameter>\n<parameter=count>"
    )
    turn = coder["reader"].read(text, TYPES)
    assert (turn.calls, turn.malformed, turn.content) == ((), 1, text), turn
    assert_nothing_lost(coder, text, ["1+2", "4"])


# Values as an agent editing code about tool calls writes them: close markers inside, not followed by the form.
_VALUES = st.sampled_from(["1+2", "Paris", "see </parameter> here", "a </function> b", "x </tool_call> y", "a\nb"])
_STRAYS = ["XYZ", "note: done", "XYZ </parameter>", "QQ </function>", "}"]


@st.composite
def _stray_turn(draw: Any) -> tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, int]]]:
    """1-2 calls of distinct tools, each with 1-3 parameters of the template's types, and where to put stray text
    (after a call's name line, after any parameter's close: ``(stray, which place)``)."""
    names = draw(
        st.lists(st.sampled_from(["calculator", "web_search", "get-weather"]), min_size=1, max_size=2, unique=True)
    )
    calls = []
    for name in names:
        pool = {"expression": draw(_VALUES), "count": draw(st.integers(-50, 50)), "exact": draw(st.booleans())}
        pool["tags"] = draw(st.lists(_VALUES, min_size=1, max_size=2))
        keys = draw(st.lists(st.sampled_from(sorted(pool)), min_size=1, max_size=3, unique=True))
        calls.append((name, {k: pool[k] for k in keys}))
    places = sum(1 + len(a) for _, a in calls)
    chosen = draw(st.lists(st.integers(0, places - 1), max_size=3, unique=True))
    return calls, [(f"{draw(st.sampled_from(_STRAYS))} #{i}", at) for i, at in enumerate(chosen)]


def _with_strays(text: str, strays: list[tuple[str, int]]) -> str:
    """``text`` with each stray written on its own line at its place (after a call's name line or a close)."""
    import re

    places = [m.end() for m in re.finditer(r"<function=[^>\n]+>\n|\n</parameter>\n", text)]
    out, at = [], 0
    for stray, where in sorted(strays, key=lambda s: places[s[1]]):
        out += [text[at : places[where]], stray + "\n"]
        at = places[where]
    return "".join([*out, text[at:]])


def test_stray_text_and_close_markers_in_keyed_calls_lose_nothing(coder):
    @settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(_stray_turn())
    def holds(drawn):
        calls, strays = drawn
        rendered = text_of(coder, calls)
        text = _with_strays(rendered, strays)
        assert_nothing_lost(coder, text, [s for s, _ in strays])
        if not strays:  # as the template writes it: every call read exactly
            turn = coder["reader"].read(text, TYPES)
            assert [(c.name, json.loads(c.arguments)) for c in turn.calls] == calls, (text, turn)

    holds()


def test_mutation_the_form_not_checked_after_the_parameters_is_caught(coder, monkeypatch):
    text = text_of(coder, ONE).replace("3\n</parameter>\n", "3\n</parameter>\nXYZ\n")
    assert_nothing_lost(coder, text, ["XYZ"])
    monkeypatch.setattr(keyed.KeyedValues, "call_goes_on", lambda self, text, at: True)
    with pytest.raises(AssertionError):
        assert_nothing_lost(coder, text, ["XYZ"])


def test_mutation_an_unread_keyed_section_closed_at_its_first_trail_chunk_is_caught(coder, monkeypatch):
    text = text_of(coder, ONE).replace("3\n</parameter>\n", "3\n</parameter>\nXYZ\n")
    monkeypatch.setattr(coder["reader"], "whole_trail", None)
    with pytest.raises(AssertionError):
        assert_nothing_lost(coder, text, ["XYZ"])
