"""What the reader learns from each template, and the literal patterns it reads with.

Every template case is classified (``call_reader_cases``): a template that renders calls gets a reader of the
encoding it writes, proved on its own render of two calls (or one, where it renders one); one that renders no
readable call gets None and the reason, never a guess.
"""

from __future__ import annotations

import re

import pytest
from call_reader_cases import LEARNED, NOT_LEARNED, case_renderer

from verl_ext.core.call_reader import learn_call_reader
from verl_ext.core.call_reader.literals import COUNTER, chunks, counted, spaced
from verl_ext.core.probe import probe_template


@pytest.mark.parametrize("case", sorted(LEARNED))
def test_a_template_that_renders_calls_gets_a_reader(case):
    r = case_renderer(case)
    learned = learn_call_reader(r, probe_template(r))
    assert learned.reader is not None, learned.why
    assert learned.reader.form.encoding == LEARNED[case]
    assert learned.proof[0] == ("qxtoola", {"qxka": "QXVA1"})
    assert learned.proof[1:] in ((), (("qxtoolb", {"qxkb": "QXVB2"}),))
    assert "qxtoola" in learned.example


@pytest.mark.parametrize("case", sorted(NOT_LEARNED))
def test_a_template_without_readable_calls_gets_none_and_why(case):
    r = case_renderer(case)
    learned = learn_call_reader(r, probe_template(r))
    assert learned.reader is None
    assert NOT_LEARNED[case] in learned.why


def test_literals_are_chunks_read_with_any_spacing():
    assert chunks("\n<tool_call>\n") == ["<tool_call>"]
    assert chunks("<|channel|>commentary json<|message|>") == ["<|channel|>", "commentary", "json", "<|message|>"]
    pattern = re.compile(spaced("<|end|><|start|>assistant"))
    assert pattern.fullmatch("<|end|> <|start|>\nassistant")
    assert not pattern.fullmatch("<|end|>assistant")


def test_a_number_that_counts_the_calls_is_learned_as_a_counter():
    assert (
        counted([":0<|tool_call_argument_begin|>", ":1<|tool_call_argument_begin|>"])
        == f":{COUNTER}<|tool_call_argument_begin|>"
    )
    assert counted(["a", "b"]) is None  # differs in more than a number: nothing is learned


HERMES = "templates/NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use"


def _schemas(schema: dict) -> list[dict]:
    """``schema`` and every schema nested in it."""
    nested = [*(schema.get("properties") or {}).values(), *([schema["items"]] if "items" in schema else [])]
    return [schema, *(s for n in nested for s in _schemas(n))]


def test_probe_tools_are_schemas_a_schema_expanding_template_renders():
    """The probe's tool schemas are JSON Schema any template can expand: arrays with ``items``, objects with
    ``properties``, no ``null`` type (Hermes' tool_use macro recurses without end on it); the Hermes tool_use template
    renders them, and its calls are learned."""
    from verl_ext.core.call_reader.learn import probe_tools

    for tool in probe_tools():
        for schema in _schemas(tool["function"]["parameters"]):
            assert schema.get("type") != "null" and "null" not in (schema.get("type") or [])
            assert schema.get("type") != "array" or "items" in schema
            assert schema.get("type") != "object" or "properties" in schema
    r = case_renderer(HERMES)
    r.render_text([{"role": "user", "content": "x"}], probe_tools(), add_generation_prompt=True)
    learned = learn_call_reader(r, probe_template(r))
    assert learned.reader is not None, learned.why


def test_a_template_that_fails_on_a_probe_schema_is_told_apart_from_one_that_refuses_calls(monkeypatch):
    """Where the template cannot render the probe's tool schemas, the reason names the exception and the parameter
    (the mutation: the probe's null parameter declared ``"type": "null"`` again, as before issue 37), never "refuses
    an assistant turn with a tool call"."""
    from verl_ext.core.call_reader import learn

    monkeypatch.setitem(learn._SCHEMAS, "null", {"type": "null"})
    r = case_renderer(HERMES).with_template_kwargs({})  # a renderer of its own: the cache keys on the template
    learned = learn._Learner(r, probe_template(r)).learn()
    assert learned.reader is None
    assert "fails rendering the probe's tool schemas: RecursionError" in learned.why, learned.why
    assert "in parameter 'qxkz' (null)" in learned.why
    assert "refuses" not in learned.why
