"""False alarms the loop-output property found on tests/fixtures/templates, each pinned as one loop-built rollout.

Each rollout is built as ``verl_ext_tool_agent`` builds it (``loop_rollouts``) from engine output written as text
(special-token text becomes the special token, as an engine samples it), with the verl tool parser a run would use;
the check must find no defect and no engine-view failure. The last test pins a finding that is not a false alarm:
verl's Kimi parser turns arguments it cannot read as an object into ``{}``, a call the model never wrote.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pytest
from loop_rollouts import build_loop_rollout
from template_fixtures import template_renderer
from test_loop_output_property import HERMES_CALL, fixture_parser

from verl_ext.check import Cause, ConsistencyChecker
from verl_ext.check.findings import CheckResult
from verl_ext.check.policy import CheckPolicy
from verl_ext.core.probe import probe_template
from verl_ext.core.rendering import ChatRenderer


@dataclass(frozen=True)
class Case:
    template: str
    outputs: tuple[str, ...]  # one engine output per turn, as text
    tool_texts: tuple[str, ...] = ()
    user_after_text: bool = False
    response_length: int = 512


CASES = {
    # Seed-OSS writes an assistant message with no content and no call as "<seed:bos>assistant", without the
    # generation prompt's newline and without its close: the close the engine sampled (or verl_ext inserted) stays.
    "an empty message the template writes without a close": Case(
        "ByteDance-Seed-OSS", ("<seed:eos>", "", "Fine.<seed:eos>"), ("x", "y"), user_after_text=True
    ),
    # The gap after the call (close, [TOOL_RESULTS]call id[TOOL_CONTENT][/TOOL_RESULTS]) cut at its edges is the call
    # id alone, which the message's own render holds too ([CALL_ID]c00000000): no anchor.
    "a call id the message renders too": Case(
        "Mistral-Small-3.2-24B-Instruct-2506", (HERMES_CALL + " x\n\n", "Done.</s>"), ("",)
    ),
    # DeepSeek-R1 pre-fills "<think>\n" and does not re-render it: a short context message ("ok") leaves a gap of
    # three tokens around it once the pre-fill is cut.
    "a short context message around a pre-fill": Case(
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
        ("hi<｜end▁of▁sentence｜>", "yo<｜end▁of▁sentence｜>", "Fine.<｜end▁of▁sentence｜>"),
        ("ok", "ok"),
        user_after_text=True,
    ),
    # DeepSeek-R1 closes its tool outputs with <｜tool▁outputs▁end｜> before a generation, and writes a later
    # tool-call turn into the calls block instead (no outputs end, no <｜Assistant｜>).
    "a tool-call turn after a tool result": Case(
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
        (HERMES_CALL + "<｜end▁of▁sentence｜>", HERMES_CALL + "<｜end▁of▁sentence｜>"),
        ("ok",),
    ),
    # With content ("\n") besides the call, DeepSeek-R1 writes a close after the calls and one after the content:
    # the first one is inside the message, the turn's close is the one verl_ext inserted after the alias stop.
    "a close the template writes inside the message": Case(
        "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
        ("\n" + HERMES_CALL + "<|endoftext|>", "<｜end▁of▁sentence｜>"),
        ("ok",),
        response_length=64,
    ),
    # Phi-4-mini's Ollama template writes </s> where a conversation ends and <|assistant|> as its generation
    # prompt: the prompt's tail a response cut at the length limit ends on is the generation prompt.
    "a generation prompt the template writes instead of its end": Case(
        "phi-4-mini-instruct_ollama-gguf", (" 000000<|end|>", "<|end|>"), (), user_after_text=True, response_length=16
    ),
    # functionary writes "all\n" before the content and ">>>NAME\n" before each call's arguments.
    "content and a call in functionary's own format": Case(
        "meetkai-functionary-medium-v3.2", ("a 🙂 " + HERMES_CALL + "<|eot_id|>", "Done.<|eot_id|>"), ("2",)
    ),
    # Llama 3.x writes the call as {"name": ..., "parameters": ...}.
    "a call Llama writes with parameters": Case(
        "meta-llama-Llama-3.2-3B-Instruct", (HERMES_CALL + "<|eot_id|>", "Done.<|eot_id|>"), ("2",)
    ),
    # DeepSeek-V3.1 writes the name as text between its own tool-call markers; the content around the call block
    # (which verl's parser took out) is two pieces of the sampled text.
    "content around a call block": Case(
        "deepseek-ai-DeepSeek-V3.1", ("text " + HERMES_CALL + " 🙂<｜end▁of▁sentence｜>", "Done."), ("2",)
    ),
    # A template that writes only the call's name, after content that holds the same text.
    "content that holds the template's call text": Case(
        "verl-ext-name-only-tool-calls", ("x [call: calculator]" + HERMES_CALL + "<|end|>", "Done.<|end|>"), ("2",)
    ),
    # Kimi-K2 names each call functions.NAME:INDEX; verl's kimi parser reads its own format.
    "Kimi's own calls": Case(
        "moonshotai-Kimi-K2",
        (
            "<|tool_calls_section_begin|><|tool_call_begin|>functions.calculator:0<|tool_call_argument_begin|>"
            '{"x": "3"}<|tool_call_end|><|tool_calls_section_end|><|im_end|>',
            "Done.<|im_end|>",
        ),
        ("2",),
    ),
}


@functools.cache
def renderer(template: str) -> ChatRenderer:
    return template_renderer(template)  # one copy of the tokenizer per template for the module (no test changes it)


def check(case: Case) -> CheckResult:
    r = renderer(case.template)
    profile = probe_template(r)
    outputs = [r.encode(text) for text in case.outputs]
    _, rollout = build_loop_rollout(
        r,
        profile,
        fixture_parser(r, profile),
        outputs,
        case.tool_texts,
        user_after_text=case.user_after_text,
        response_length=case.response_length,
    )
    return ConsistencyChecker(r, profile, CheckPolicy(mode="warn")).check_rollout(rollout, template_view=True)


@pytest.mark.parametrize("name", list(CASES))
def test_no_false_alarm(name):
    result = check(CASES[name])
    assert result.engine_ok, result.summary()
    assert result.template_view and not result.template_view_skipped
    assert not result.defects, [
        (f.cause.value, f.turn, f.stream_text, f.rendered_text, f.detail) for f in result.defects
    ]


def test_seed_oss_empty_message_is_named_for_its_missing_close():
    result = check(CASES["an empty message the template writes without a close"])
    named = [f.detail for f in result.findings if "without a close" in f.detail]
    assert named and all(f.allowed for f in result.findings if "without a close" in f.detail), result.summary()


def test_kimi_parser_arguments_it_cannot_read_are_a_call_the_model_never_wrote():
    """Arguments written as a JSON string (Kimi's template writes ``tojson`` of a string that way) are read by verl's
    kimi parser as ``{}``: the message holds a call the model never wrote, and the loop runs it. A real finding."""
    text = (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.calculator:0<|tool_call_argument_begin|>"
        '"{\\"x\\": \\"3\\"}"<|tool_call_end|><|tool_calls_section_end|><|im_end|>'
    )
    result = check(Case("moonshotai-Kimi-K2", (text, "Done.<|im_end|>"), ("2",)))
    differs = [f for f in result.defects if f.cause is Cause.MESSAGE_DIFFERS]
    assert differs and differs[0].turn == 0 and "{}" in differs[0].detail, result.summary()


def test_deepseek_r1_second_tool_round_is_written_into_the_first_rounds_blocks():
    """DeepSeek-R1-Distill's template writes all tool results of a conversation into one outputs block (its namespace
    flags are never reset). The probe finds it (``tool_rounds_share_state``) and verl_ext renders a later round's
    context after a synthetic earlier round, so the second round continues the first block as the template does."""
    call = HERMES_CALL + "<｜end▁of▁sentence｜>"
    case = Case("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", (call, call, "<｜end▁of▁sentence｜>"), ("ok", "ok"))
    assert probe_template(renderer(case.template)).tool_rounds_share_state
    result = check(case)
    assert result.engine_ok and not result.defects, result.summary()
