"""``parse_turn`` where verl's parser and the reader derived from the template read a turn differently.

The reading that leaves no call-like text outside its calls is taken (``call_reader.leftover``: the markers of the
template's learned form outside JSON strings; a block verl's parser could not read is such text), verl's where both
or neither leave some; the turn is marked ``disagree`` and the loop counts it (``tito/tool/readings_disagree``, the
gateway ``readings_disagree``). Both orders are tested: verl's hermes parser cutting a call at a ``</tool_call>``
inside a JSON string (the derived reading right), and a derived reader that loses a call (verl's right). Qwen3's
tokenizer and template, verl's real hermes parser.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
from loop_rollouts import parse_text, verl_parser
from rollouts import TOOLS

from verl_ext.core.call_reader import CallReader, ReadTurn, learn_call_reader
from verl_ext.core.call_reader.leftover import call_markers, call_text_left
from verl_ext.core.probe import probe_template
from verl_ext.core.turn_end import end_of_turn_ids
from verl_ext.core.turn_parse import ParsedTurn

GOOD = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>'
IN_STRING = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "a </tool_call> b"}}\n</tool_call>'
CUT = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "9'
PARAMETERS = '<tool_call>\n{"name": "calculator", "parameters": {"expression": "2+2"}}\n</tool_call>'


class _LosesLastCall(CallReader):
    """A derived reader that reads the turn, then loses its last call (the injected defect): its text is left
    outside the reading's calls."""

    def read(self, text: str, types: Any = None) -> ReadTurn:
        turn = super().read(text, types)
        return dataclasses.replace(turn, calls=turn.calls[:-1], spans=turn.spans[:-1]) if turn.calls else turn


@pytest.fixture(scope="module")
def qwen3(renderer_for: Any) -> dict[str, Any]:
    r = renderer_for("qwen3")
    profile = probe_template(r)
    reader = learn_call_reader(r, profile).reader
    return {"r": r, "profile": profile, "parser": verl_parser(r, profile), "reader": reader}


def read(parts: dict[str, Any], text: str, reader: Any = "derived", parser: Any = "verl") -> ParsedTurn:
    return parse_text(parts, text, TOOLS, reader, parser)


def expressions(turn: ParsedTurn) -> list[str]:
    return [json.loads(c.arguments)["expression"] for c in turn.calls]


def test_the_derived_reading_is_taken_where_verl_cuts_a_call_inside_a_json_string(qwen3):
    text = GOOD + "\n" + IN_STRING
    alone = read(qwen3, text, reader=None)  # verl's parser alone: the second call cut at the marker in its string
    assert expressions(alone) == ["1+2"] and "</tool_call>" in alone.message["content"], alone
    turn = read(qwen3, text)
    assert expressions(turn) == ["1+2", "a </tool_call> b"], turn
    assert turn.derived and turn.disagree and turn.malformed == 0
    assert "tool_call>" not in turn.message["content"], turn.message  # the tool and the client get no leftover
    assert [c["function"]["arguments"] for c in turn.message["tool_calls"]][1] == {"expression": "a </tool_call> b"}


def test_verls_reading_is_taken_where_the_derived_reader_loses_a_call(qwen3):
    text = GOOD + "\n" + GOOD.replace("1+2", "3+4")
    turn = read(qwen3, text, reader=_LosesLastCall(qwen3["reader"].form))
    assert expressions(turn) == ["1+2", "3+4"], turn
    assert turn.disagree and not turn.derived


def test_readings_that_agree_are_verls_and_not_a_disagreement(qwen3):
    turn = read(qwen3, GOOD + "\n" + GOOD.replace("1+2", "3+4"))
    assert expressions(turn) == ["1+2", "3+4"] and not turn.disagree and not turn.derived


def test_where_both_readings_leave_call_text_verls_is_taken(qwen3):
    """A stray closer after the calls is call text outside the calls in both readings: verl's (as before), counted."""
    turn = read(qwen3, GOOD + "\n" + IN_STRING + "\nstray </tool_call> text")
    assert expressions(turn) == ["1+2"] and turn.disagree and not turn.derived


def test_a_call_cut_by_the_stop_is_left_by_both_readings(qwen3):
    """A call cut at the end stays in both readings' content as written: not counted against either, so the
    derived reading, which alone reads the call with the marker in its string, is taken."""
    turn = read(qwen3, GOOD + "\n" + IN_STRING + "\n" + CUT)
    assert expressions(turn) == ["1+2", "a </tool_call> b"] and turn.disagree and turn.derived
    assert turn.message["content"].strip() == CUT, turn.message
    assert not read(qwen3, GOOD + "\n" + CUT).disagree  # the cut call alone: the readings agree


def test_a_block_verl_could_not_read_is_call_text_it_left(qwen3):
    """``parameters`` for ``arguments``: verl's parser counts the block malformed (and takes it out of its content);
    the derived reader reads the call: its reading leaves no call text, and is taken."""
    turn = read(qwen3, GOOD + "\n" + PARAMETERS)
    assert expressions(turn) == ["1+2", "2+2"] and turn.derived and turn.disagree and turn.malformed == 0


def test_call_text_is_the_forms_markers_outside_json_strings(qwen3):
    form = qwen3["reader"].form
    assert call_markers(form) == ("<tool_call>", "</tool_call>")
    assert call_text_left(form, 'b"}}\n</tool_call>') == "</tool_call>"
    assert call_text_left(form, 'the config is {"stop": "</tool_call>"} here') is None  # inside a JSON string
    assert call_text_left(form, 'as JSON: {"name": "calculator", "arguments": {}}') is not None  # a call object
    assert call_text_left(form, "no call here {not json</tool_call>") == "</tool_call>"


def _loop_counters(parts: dict[str, Any], text: str) -> Counter[str]:
    """What ``verl_ext_tool_agent``'s parse step counts for one turn (its own ``_parse``, over the runtime's parts)."""
    from verl_ext.plugin.agent_loop import VerlExtToolAgentLoop

    r, profile = parts["r"], parts["profile"]
    runtime = SimpleNamespace(
        end_of_turn_ids=end_of_turn_ids(profile), renderer=r, profile=profile, call_reader=parts["reader"]
    )
    loop = SimpleNamespace(tool_parser=parts["parser"], rt=runtime, max_parallel_calls=8)
    counters: Counter[str] = Counter()
    ids = [*r.encode(text), min(profile.close_id_set)]
    asyncio.run(VerlExtToolAgentLoop._parse(loop, ids, 0, counters, {}))  # type: ignore[arg-type]
    return counters


def test_the_loop_counts_readings_that_disagree(qwen3):
    assert _loop_counters(qwen3, GOOD + "\n" + IN_STRING)["tool/readings_disagree"] == 1
    assert _loop_counters(qwen3, GOOD + "\n" + GOOD)["tool/readings_disagree"] == 0
