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
    if text is None or "Let me compute that." not in text or "calculator" not in text:
        pytest.skip("the template renders no content beside calls")  # DeepSeek V3 renders calls only without content
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


# Llama 3.1-3.3 call the tools named by the template's ``builtin_tools`` variable in Python after <|python_tag|>.
LLAMA = "templates/meta-llama-Llama-3.3-70B-Instruct"
BUILTIN = ("brave_search", "wolfram_alpha")
# The template writes k="v" with the value as is: values a Python string literal in double quotes holds unescaped.
_PY_WORDS = st.sampled_from(["Paris", "a b", "x=1, y=2", "中文", "🙂", "(a", "a)b", "3", "true", "{x}", "it's"])


def test_python_calls_are_learned_only_where_the_template_renders_them():
    assert learn_call_reader(case_renderer(LLAMA), probe_template(case_renderer(LLAMA))).reader.form.python_lead == (
        "<|python_tag|>",
    )
    sibling = case_renderer("templates/meta-llama-Llama-3.2-3B-Instruct")  # no builtin_tools variable
    assert learn_call_reader(sibling, probe_template(sibling)).reader.form.python_lead == ()


def test_python_calls_of_builtin_tools_are_read_back():
    base = case_renderer(LLAMA)
    profile = probe_template(base)
    reader = learn_call_reader(base, profile).reader
    r = base.with_template_kwargs({"builtin_tools": list(BUILTIN)})

    @settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def holds(data):
        name = data.draw(st.sampled_from(BUILTIN))
        args = data.draw(st.dictionaries(st.sampled_from(["query", "q", "lang"]), _PY_WORDS, min_size=1, max_size=3))
        text = rendered_turn(r, profile, assistant_message(profile, [(name, args)]))
        assert text is not None and f"<|python_tag|>{name}.call(" in text
        text = text.removesuffix("<|eom_id|>")  # the turn's stop (the template's close after a built-in call)
        # as models vary it: spacing around the tag, '=' and ','; single quotes where the value holds none
        sep = data.draw(st.sampled_from(["=", " = "]))
        comma = data.draw(st.sampled_from([", ", ",", " , "]))
        quote = data.draw(st.sampled_from(['"', "'"]))
        written = comma.join(
            f"{k}{sep}{quote if quote not in v else chr(34)}{v}{quote if quote not in v else chr(34)}"
            for k, v in args.items()
        )
        varied = data.draw(st.sampled_from(["", " ", "\n"])) + f"<|python_tag|>{name}.call({written})"
        for t in (text, varied):
            turn = reader.read(t)
            assert [(c.name, json.loads(c.arguments)) for c in turn.calls] == [(name, args)], t
            assert turn.malformed == 0 and not turn.content.strip(), turn

    holds()


def test_python_calls_with_other_literals_are_read():
    reader = learn_call_reader(case_renderer(LLAMA), probe_template(case_renderer(LLAMA))).reader
    turn = reader.read("<|python_tag|>wolfram_alpha.call(query='2+2', n=3, r=0.5, exact=True, note=None, l=[1, 'a'])")
    assert [(c.name, json.loads(c.arguments)) for c in turn.calls] == [
        ("wolfram_alpha", {"query": "2+2", "n": 3, "r": 0.5, "exact": True, "note": None, "l": [1, "a"]})
    ]
    # a custom tool's JSON after the tag (Llama 3.1 models write it so) reads in the template's JSON form
    turn = reader.read('<|python_tag|>{"name": "calculator", "parameters": {"expression": "1+2"}}')
    assert [(c.name, json.loads(c.arguments)) for c in turn.calls] == [("calculator", {"expression": "1+2"})]


@pytest.mark.parametrize(
    "text",
    [
        "<|python_tag|>print(1)",  # code for the interpreter: no call of a tool
        "import os\n<|python_tag|>os.system('ls')",
        '<|python_tag|>brave_search.call("Paris")',  # a positional argument
        "<|python_tag|>brave_search.call(query=city)",  # a variable
        '<|python_tag|>brave_search.call(query="Paris"',  # unclosed
        "<|python_tag|>brave_search.call(**{'query': 'Paris'})",
        "<|python_tag|>brave_search.call(query={1, 2})",  # a set: no JSON value
        '<|python_tag|>brave_search.lookup(query="Paris")',
    ],
)
def test_what_is_not_a_python_call_is_counted_malformed(text):
    reader = learn_call_reader(case_renderer(LLAMA), probe_template(case_renderer(LLAMA))).reader
    turn = reader.read(text)
    assert turn.calls == () and turn.malformed == 1
    assert "<|python_tag|>" in turn.content  # the text stays: the message describes what was sampled
