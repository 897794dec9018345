"""Whitespace inside a keyed XML parameter's value (Qwen3-Coder's ``<parameter=K>\\nVALUE\\n</parameter>``), compared as
the value it reads as, never as spacing around calls.

The template writes each value as ``'\\n' + (value if string else value|string) + '\\n'``. Its parser, verl's
qwen3_coder (the loop's default for the format), takes one newline off each side and converts by the declared type: a
string keeps every other whitespace, a number or a JSON or Python literal (``None``, ``[False]``) reads the same with
whitespace around it, a boolean compares the text with ``true`` as it is (``"True\\n"`` reads false). The derived reader
takes all the whitespace off. So a model writing ``<parameter=note> None </parameter>`` or ``\\n\\n[False]\\n`` wrote
the same value; ``\\n\\n1+2\\n\\n`` is the string ``"\\n1+2\\n"`` to verl's parser and ``"1+2"`` to the derived reader,
and the message holds either. The check must allow exactly those readings of the text (the template then writes the same
value its own way: allowed, named) and report any other value in the call's turn: a changed character, whitespace no
reading gives, a boolean verl's parser read false from ``True``.

On the real template and the shipped Qwen3 tokenizer, rollouts built as the loop builds them (verl's parser with the
derived reader behind it, and the derived reader alone).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

import pytest
from call_reader_cases import call_turn_rollout, case_renderer

from verl_ext.check import ConsistencyChecker
from verl_ext.check.policy import CheckPolicy
from verl_ext.core.call_reader import learn_call_reader
from verl_ext.core.probe import probe_template

CODER = "qwen3/qwen3-coder-30b-a3b-instruct_ollama-gguf"


def keyed_turn(values: dict[str, str]) -> str:
    """One call of ``calculator`` with each parameter's raw text as given (the template writes ``\\nVALUE\\n``)."""
    params = "".join(f"<parameter={k}>{v}</parameter>\n" for k, v in values.items())
    return f"<tool_call>\n<function=calculator>\n{params}</function>\n</tool_call>"


# Raw value texts spaced otherwise than the template writes them, each read as the same value by both readers.
SPACED = {
    "expression": "\n\n1+2\n\n",  # verl: "\n1+2\n"; the derived reader: "1+2"
    "count": " 7\n",
    "ratio": "\n\n0.5 ",
    "note": " None ",
    "tags": "\n\n[False, 'a b']\n",
    "filters": " {'a': '{x}'}\n\n",
    "exact": "\nTrue\n",
}


@pytest.fixture(scope="module")
def coder() -> tuple[Any, Any, Any, Any]:
    from verl.experimental.agent_loop.tool_parser import ToolParser

    r = case_renderer(CODER)
    profile = probe_template(r)
    reader = learn_call_reader(r, profile).reader
    return r, profile, reader, ToolParser.get_tool_parser("qwen3_coder", r.tokenizer)


def checked(coder: Any, text: str, verl: bool, mutate: Any = None, derived: bool = True) -> tuple[dict[str, Any], Any]:
    """The first call's arguments as the loop read them, and the check's result (after ``mutate`` changed the
    message's arguments, where given); ``derived`` False: verl's parser alone reads the turn."""
    r, profile, reader, parser = coder
    lr, rollout = call_turn_rollout(r, profile, text, parser if verl else None, reader if derived else None)
    messages = copy.deepcopy([dict(m) for m in rollout.messages])
    at = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    function = messages[at]["tool_calls"][0]["function"]
    args = function["arguments"]
    args = json.loads(args) if isinstance(args, str) else args
    if mutate is not None:
        changed = mutate(dict(args))
        function["arguments"] = json.dumps(changed) if isinstance(function["arguments"], str) else changed
    checker = ConsistencyChecker(r, profile, CheckPolicy(mode="warn"))
    return args, checker.check_rollout(dataclasses.replace(rollout, messages=tuple(messages)), template_view=True)


@pytest.mark.parametrize("verl", [True, False], ids=["verl-qwen3_coder", "derived"])
def test_whitespace_inside_values_is_no_defect_where_the_value_reads_the_same(coder, verl):
    args, result = checked(coder, keyed_turn(SPACED), verl)
    want = {"count": 7, "ratio": 0.5, "note": None, "tags": [False, "a b"], "filters": {"a": "{x}"}, "exact": True}
    assert {k: v for k, v in args.items() if k != "expression"} == want
    assert args["expression"] == ("\n1+2\n" if verl else "1+2")  # the string keeps what verl's parser keeps
    defects = [(f.cause.value, f.detail[:200]) for f in result.findings if not f.allowed]
    assert not defects and result.engine_ok, defects
    if not verl:  # the template writes the stripped string with its own newlines: allowed, named
        assert any(f.cause.value == "tool_call_reserialized" for f in result.findings), result.findings


def _set(key: str, value: Any) -> Any:
    return lambda args: {**args, key: value}


MUTATIONS = {
    "changed character": _set("expression", "1+3"),
    "whitespace no reading gives": _set("expression", " 1+2"),
    "changed number": _set("count", 8),
    "changed literal": _set("tags", [True, "a b"]),
    "changed boolean": _set("exact", False),
    "dropped parameter": lambda args: {k: v for k, v in args.items() if k != "ratio"},
}


@pytest.mark.parametrize("verl", [True, False], ids=["verl-qwen3_coder", "derived"])
@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_changed_value_inside_a_parameter_is_reported_in_its_turn(coder, verl, mutation):
    _, result = checked(coder, keyed_turn(SPACED), verl, MUTATIONS[mutation])
    assert any(f.turn == 0 and not f.allowed for f in result.findings), (mutation, result.findings)


@pytest.mark.parametrize(
    ("verl", "derived"), [(True, False), (True, True), (False, True)], ids=["verl-alone", "verl-and-derived", "derived"]
)
def test_a_boolean_read_false_from_true_is_a_defect(coder, verl, derived):
    """verl's qwen3_coder parser compares a boolean's text with ``true`` as it is: ``\\nTrue\\n\\n`` (one newline
    more than the template writes) reads ``False``. Read by verl's parser alone, the tool is called with it, the
    message does not hold what was sampled, and the check says so; with the derived reader beside it (the loop's
    reading), verl's ``False`` is not what the text writes (``faults.NOT_WRITTEN``), the derived reading (True) is
    taken, and the turn is clean, as with the derived reader alone."""
    args, result = checked(coder, keyed_turn({"expression": "\n1+2\n", "exact": "\nTrue\n\n"}), verl, derived=derived)
    wrong = verl and not derived
    assert args["exact"] is (not wrong)
    defects = [f for f in result.findings if not f.allowed and f.turn == 0]
    assert bool(defects) is wrong, result.findings
    if wrong:
        assert defects[0].cause.value == "message_differs", defects
