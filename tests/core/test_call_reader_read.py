"""The derived reader reads back every call a template renders, as the template renders it and as models vary it.

For every template that renders tool calls (``call_reader_cases.LEARNED``): calls drawn with names and arguments of
every JSON type (one call, or several where the template renders several; after content where it renders content
with calls) are rendered by the template, varied as models vary them (key order, separators, whitespace next to
markers), and read back: each call with its name and arguments, nothing counted malformed. Hypothesis,
derandomized, bounded examples.
"""

from __future__ import annotations

import json

import pytest
from call_reader_cases import (
    LEARNED,
    PARAMS,
    PARAMS_ANY,
    TOOL_NAMES,
    assistant_message,
    calls,
    case_renderer,
    rendered_turn,
    varied_text,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_ext.core.call_reader import learn_call_reader
from verl_ext.core.probe import probe_template

TYPES = {name: {**PARAMS, **PARAMS_ANY} for name in TOOL_NAMES}


@pytest.mark.parametrize("case", sorted(LEARNED))
def test_every_rendered_call_is_read_back(case):
    r = case_renderer(case)
    profile = probe_template(r)
    reader = learn_call_reader(r, profile).reader
    assert reader is not None

    @settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def holds(data):
        drawn = data.draw(calls(reader.form.several))
        text = rendered_turn(r, profile, assistant_message(profile, drawn))
        assert text is not None
        varied = data.draw(varied_text(text))
        turn = reader.read(varied, TYPES)
        got = [(c.name, json.loads(c.arguments)) for c in turn.calls]
        assert got == [(n, a) for n, a in drawn], f"{varied!r} read as {turn}"
        assert turn.malformed == 0

    holds()


@pytest.mark.parametrize("case", sorted(LEARNED))
def test_content_before_calls_is_kept(case):
    """Where the template renders content with calls, the content is read as content and the calls as calls."""
    r = case_renderer(case)
    profile = probe_template(r)
    reader = learn_call_reader(r, profile).reader
    drawn = [("calculator", {"expression": "1+2"})]
    text = rendered_turn(r, profile, assistant_message(profile, drawn, "Let me compute that."))
    if text is None or "Let me compute that." not in text:
        pytest.skip("the template renders no content beside calls")
    turn = reader.read(text, TYPES)
    assert [(c.name, json.loads(c.arguments)) for c in turn.calls] == drawn
    assert "Let me compute that." in turn.content
    assert "calculator" not in turn.content


HARMONY = [
    # the template's own form: recipient in the header, the constraint without its marker
    ' to=functions.calculator<|channel|>commentary json<|message|>{"expression": "1+2"}',
    # the recipient in the channel, with and without <|constrain|>
    '<|channel|>commentary to=functions.calculator <|constrain|>json<|message|>{"expression": "1+2"}',
    '<|channel|>commentary to=functions.calculator json<|message|>{"expression": "1+2"}',
    '<|channel|>commentary to=functions.calculator<|message|>{"expression":"1+2"}',
    # the recipient in the header with <|constrain|>
    ' to=functions.calculator<|channel|>commentary <|constrain|>json<|message|>{"expression": "1+2"}',
]


@pytest.mark.parametrize("text", HARMONY)
def test_harmony_calls_as_models_write_them(text):
    r = case_renderer("gpt-oss")
    reader = learn_call_reader(r, probe_template(r)).reader
    turn = reader.read(text)
    assert [(c.name, json.loads(c.arguments)) for c in turn.calls] == [("calculator", {"expression": "1+2"})]
    assert turn.content == "" and turn.malformed == 0


def test_harmony_analysis_before_a_call_is_the_content():
    """GPT-OSS renders a tool-call turn's content in the analysis channel: that is where it is read from."""
    r = case_renderer("gpt-oss")
    reader = learn_call_reader(r, probe_template(r)).reader
    text = (
        "<|channel|>analysis<|message|>Need the sum.<|end|><|start|>assistant<|channel|>commentary "
        'to=functions.calculator <|constrain|>json<|message|>{"expression": "1+2"}'
    )
    turn = reader.read(text)
    assert turn.content == "Need the sum."
    assert [c.name for c in turn.calls] == ["calculator"]


@pytest.mark.parametrize(
    ("case", "text"),
    [
        ("qwen3", "<tool_call>\n{not json}\n</tool_call>"),
        ("qwen3", '<tool_call>\n{"name": "calculator"}\n</tool_call>'),  # no arguments: not a call
        (
            "templates/deepseek-ai-DeepSeek-V3.1",
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>calculator<｜tool▁sep｜>1+2",
        ),
        ("gpt-oss", ' to=functions.calculator<|channel|>commentary json<|message|>{"expression": '),
    ],
)
def test_what_is_not_a_call_is_counted_malformed(case, text):
    r = case_renderer(case)
    reader = learn_call_reader(r, probe_template(r)).reader
    turn = reader.read(text)
    assert turn.calls == ()
    assert turn.malformed == 1
    assert turn.content.strip()  # the text stays: the message describes what was sampled


@pytest.mark.parametrize("case", ["qwen3", "templates/meta-llama-Llama-3.2-3B-Instruct", "gpt-oss"])
def test_text_without_calls_is_content_only(case):
    r = case_renderer(case)
    reader = learn_call_reader(r, probe_template(r)).reader
    turn = reader.read("The answer is 3. I used {x} and <b>tags</b>.")
    assert turn.calls == () and turn.malformed == 0
    assert turn.content == "The answer is 3. I used {x} and <b>tags</b>."
