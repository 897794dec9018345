"""The per-turn verdict: an assistant message holds what the engine sampled, or it does not (and says what)."""

from __future__ import annotations

import re

import pytest

from verl_ext.check.sampled_text import frame_runs, message_holds_sampled

STRUCTURE = re.compile(r"<think>|</think>|<tool_call>|</tool_call>|<\|im_end\|>|<\|channel\|>|<\|message\|>")
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>'


@pytest.mark.parametrize(
    ("sampled", "rendered"),
    [
        ("\n  The answer.  \n", "The answer."),  # whitespace the template strips
        ("</think>x", "<think>\n\n</think>\n\nx"),  # reasoning tags re-written
        ("<think>long thought</think>\n\nok", "ok"),  # reasoning dropped
        ('<tool_call>{"arguments": {"expression": "1+2"}, "name": "calculator"}</tool_call>', CALL),  # key order
        ('A <tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call> B', "A  B\n" + CALL),
        (CALL, CALL.replace('{"expression": "1+2"}', '"{\\"expression\\": \\"1+2\\"}"')),  # arguments as a string
        (
            '[{"name": "calculator", "arguments": {"x": 1}}]',
            '[{"name": "calculator", "arguments": {"x": 1}, "id": "c1"}]',
        ),
    ],
)
def test_the_template_writing_the_same_message_its_own_way_holds(sampled, rendered):
    assert message_holds_sampled(sampled, rendered, STRUCTURE).holds


@pytest.mark.parametrize(
    ("sampled", "rendered", "named"),
    [
        (CALL, CALL.replace("1+2", "1+1"), "JSON"),  # a call run with other arguments than sampled
        (CALL, CALL.replace("calculator", "search"), "JSON"),  # another tool
        ('{"a": {"type": "x"}}', '{"a": {"type": "y"}}', "JSON"),  # metadata keys are only set aside at the top
        ("The answer is 2.", "The answer is 3.", "text"),
        ("x²", "x2", "text"),
        ("", CALL, "JSON"),  # a call nobody sampled
    ],
)
def test_a_message_that_does_not_hold_what_was_sampled_is_named(sampled, rendered, named):
    verdict = message_holds_sampled(sampled, rendered, STRUCTURE)
    assert not verdict.holds and named in verdict.detail


def test_text_the_template_writes_around_any_content_is_its_frame():
    frame = frame_runs("<|channel|>final<|message|>", "<|im_end|>", STRUCTURE)
    assert frame == {"final"}
    assert message_holds_sampled("hello", "<|channel|>final<|message|>hello", STRUCTURE, frame).holds
    assert not message_holds_sampled("hello", "<|channel|>final<|message|>hello", STRUCTURE).holds
