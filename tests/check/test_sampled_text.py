"""The per-turn verdict: an assistant message holds what the engine sampled, or it does not (and says what)."""

from __future__ import annotations

import re

import pytest

from verl_ext.check.message_shape import SLOT
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


# A tool call the model wrote in hermes format, as templates write it in their own (found by the property test over
# tests/fixtures/templates: each of these was a false message_differs). The shapes are what ``message_shape`` gives
# for the message: the template's text with a slot where the message's data goes.
HERMES = '<tool_call>\n{"name": "calculator", "arguments": {"x": "3"}}\n</tool_call>'
OWN_FORMATS = [
    # Kimi-K2: the call's index and a "functions." prefix around the name
    ("<|tool_call_begin|>functions.calculator:0<|tool_call_argument_begin|>", "functions.QXSLOT0QX:0"),
    # Seed-OSS: the arguments as XML parameters
    (
        "<function=calculator>\n<parameter=x>3</parameter>\n</function>",
        "<function=QXSLOT0QX><parameter=QXSLOT1QX>QXSLOT2QX</parameter></function>",
    ),
    # a template that writes the name only
    ("[call: calculator]", "[call:QXSLOT0QX]"),
]


@pytest.mark.parametrize(("rendered", "shape"), OWN_FORMATS)
def test_a_call_the_template_writes_in_its_own_format_holds_what_was_sampled(rendered, shape):
    structure = re.compile(r"<\|tool_call_begin\|>|<\|tool_call_argument_begin\|>")
    parts = [SLOT.split(shape)]
    assert message_holds_sampled(HERMES, rendered, structure, shapes=parts).holds
    assert not message_holds_sampled(HERMES, rendered, structure).holds  # without the shape: text never sampled
    # A call the model did not write is still named: another tool's name in the slot.
    assert not message_holds_sampled(HERMES, rendered.replace("calculator", "search"), structure, shapes=parts).holds


def test_content_a_parser_took_a_call_block_out_of_holds_what_was_sampled():
    """verl's hermes parser returns the text around a call block as the content ("A " + " B"): the template writes
    it as one run of text that is two pieces of the sampled text, in order."""
    sampled = 'A <tool_call>{"name": "calculator", "arguments": {"x": "3"}}</tool_call> B'
    assert message_holds_sampled(sampled, "A  B", None).holds
    assert not message_holds_sampled(sampled, "B  A", None).holds  # not in the sampled order
    assert not message_holds_sampled(sampled, "A  C", None).holds


def test_the_arguments_key_a_template_writes_is_its_own():
    """Llama 3.x templates write the model's ``arguments`` as ``parameters``: the same call."""
    sampled = '{"name": "calculator", "arguments": {"x": "3"}}'
    assert message_holds_sampled(sampled, '{"name": "calculator", "parameters": {"x": "3"}}', None).holds
    assert not message_holds_sampled(sampled, '{"name": "calculator", "parameters": {"x": "4"}}', None).holds
