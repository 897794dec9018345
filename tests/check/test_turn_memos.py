"""The per-turn memos of the template view answer as the work they replace: ``message_shape`` rendered once per shape
with stand-in call ids gives the runs the message's own ids give, on every template the reader learns and ids of
several forms (ids in JSON, ids the template writes as text, ids it slices); ``SpanTexts.prefix`` extending the
previous prefix gives what decoding the whole prefix gives; and the whole check with both gives the findings it
gives without them, on the bench's rollouts of several findings per turn."""

from __future__ import annotations

from typing import Any

import pytest
from call_reader_cases import LEARNED, case_renderer
from hypothesis import given, settings
from hypothesis import strategies as st
from test_decode_memo import HOW, checked

from verl_ext.check import message_shape as shapes
from verl_ext.check.rule_context import RuleContext
from verl_ext.check.span_texts import SpanTexts
from verl_ext.core.probe import probe_template

IDS = ("call00001", "call_Ab9-x", "functions.calculator:0", "123456789", "é-ü", "", "A1")


def _message(call_id: str, second: str) -> dict[str, Any]:
    calls = [
        {"id": i, "type": "function", "function": {"name": n, "arguments": {"expression": "1+2"}}}
        for i, n in ((call_id, "calculator"), (second, "search"))
    ]
    return {"role": "assistant", "content": "", "tool_calls": calls}


@pytest.mark.parametrize("case", sorted(LEARNED))
def test_the_shape_with_stand_in_ids_is_the_shape_with_the_message_ids(case):
    r = case_renderer(case)
    profile = probe_template(r)
    for call_id in IDS:
        message = _message(call_id, call_id[::-1] + "2")
        own = shapes._shape(r, profile, shapes._masked(message))
        assert shapes.message_shape(r, profile, message) == own, (case, call_id)


# Templates that write a call's id as text (as it is, and its last three characters), over Qwen3's tokenizer.
ID_AS_TEXT = (
    "{%- for m in messages %}{{ m.role }}: {{ m.content }}{%- for c in m.tool_calls or [] %} [id {{ c.id }}] "
    "{{ c.function.name }} {{ c.function.arguments | tojson }}{%- endfor %}\n{%- endfor %}"
    "{%- if add_generation_prompt %}assistant:{% endif %}"
)


@pytest.mark.parametrize("shown", ["c.id", "c.id[-3:]"])
def test_an_id_the_template_writes_as_text_is_the_message_s_own(shown):
    from verl_ext.core.rendering import ChatRenderer

    base = case_renderer("qwen3")
    r = ChatRenderer(base.tokenizer, chat_template=ID_AS_TEXT.replace("c.id", shown))
    profile = probe_template(r)
    message = _message("call00001", "call00002")
    runs = shapes.message_shape(r, profile, message)
    assert runs == shapes._shape(r, profile, shapes._masked(message))
    assert any("001" in run for run in runs), runs  # the id is the template's text there


def test_a_stand_in_keeps_the_id_s_length_and_kinds_of_characters():
    for call_id in IDS:
        for form in shapes._STAND_IN_FORMS:
            s = shapes._stand_in(call_id, *form)
            assert len(s) == len(call_id)
            kinds = [(c.isalpha(), c.isdigit(), c.isupper()) for c in s]
            assert kinds == [(c.isalpha(), c.isdigit(), c.isupper()) for c in call_id], (call_id, s)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=8), st.sampled_from(["qwen3", "mistral-7b-v0.3"]))
def test_an_extended_prefix_reads_as_the_whole_prefix(ends, family):
    r = case_renderer(family)
    # a stream with multi-byte characters cut across tokens, braces and spaces
    ids = r.encode('{"a": "café 🙂 中文 𝄞🦩"}, {"b": {"c": 1}} 🧿𝄞 end')
    rules = SpanTexts(r, ids, ids)
    for b in ends:
        b = min(b, len(ids))
        text = r.decode(ids[2:b]) if b > 2 else ""
        assert rules.prefix(True, 2, b) == (len(text), text.count("{") - text.count("}")), (b, text)


@pytest.mark.parametrize("name", sorted(HOW))
def test_the_check_with_the_turn_memos_finds_what_it_finds_without_them(renderer_for, monkeypatch, name):
    family, kwargs, how = HOW[name]
    r = renderer_for(family).with_template_kwargs(kwargs)
    with_memos = checked(r, how)

    def whole(self: Any, in_stream: bool, a: int, b: int) -> tuple[int, int]:
        text = self.r.decode((self.stream if in_stream else self.rendered)[a:b]) if b > a else ""
        return len(text), text.count("{") - text.count("}")

    with monkeypatch.context() as m:
        m.setattr(RuleContext, "prefix", whole)
        m.setattr(shapes, "_STAND_IN_FORMS", ())  # every message rendered with its own ids
        without = checked(r, how)
    assert with_memos == without
