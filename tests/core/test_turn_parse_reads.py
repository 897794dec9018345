"""``parse_turn`` reads a turn as the engine produced it: gpt-oss calls with verl's real gpt-oss parser.

verl's ``GptOssToolParser`` matches a call as ``<|start|>assistant<|channel|>... to=functions.NAME
<|constrain|>json<|message|>ARGS<|call|>``: it needs the ``<|call|>`` stop the engine samples and the assistant
header. The generation prompt pre-fills ``<|start|>assistant``, so a turn that calls a tool directly samples only
``<|channel|>commentary to=functions.NAME ...<|call|>``; the message content never holds the stop's or the generation
prompt's text (the template renders it: a stop text there would be a fake turn boundary).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from loop_rollouts import build_loop_rollout, tool_schemas, verl_parser
from rollouts import TOOLS

from verl_ext.check import ConsistencyChecker
from verl_ext.check.policy import CheckPolicy
from verl_ext.core.probe import probe_template
from verl_ext.core.turn_end import end_of_turn_ids
from verl_ext.core.turn_parse import ParsedTurn, parse_turn

CALL = '<|channel|>commentary to=functions.calculator <|constrain|>json<|message|>{"expression": "1+2"}<|call|>'
ANALYSIS = "<|channel|>analysis<|message|>I will use the calculator.<|end|><|start|>assistant"
FINAL = "<|channel|>final<|message|>It is 3.<|return|>"
GPT_OSS = {  # text -> (calls, content)
    "direct call": (CALL, 1, ""),
    "call after analysis": (ANALYSIS + CALL, 1, ""),
    "answer": (FINAL, 0, "<|channel|>final<|message|>It is 3."),
    # the engine did not stop at <|call|>: the content is the answer, without the header and the stop around it
    "call then answer": (CALL + "<|start|>assistant" + FINAL, 1, "<|channel|>final<|message|>It is 3."),
}


@pytest.fixture(scope="module")
def gpt_oss(renderer_for: Any) -> dict[str, Any]:
    r = renderer_for("gpt-oss")
    profile = probe_template(r)
    return {"renderer": r, "profile": profile, "parser": verl_parser(r, profile)}


def read(parts: dict[str, Any], text: str) -> ParsedTurn:
    r, profile = parts["renderer"], parts["profile"]
    ids = r.encode(text)
    return asyncio.run(
        parse_turn(
            parts["parser"],
            ids,
            end_of_turn_ids(profile),
            r.decode,
            tool_schemas(TOOLS),
            0,
            None,
            generation_prompt=profile.generation_prompt_ids,
        )
    )


@pytest.mark.parametrize("case", sorted(GPT_OSS))
def test_gpt_oss_turns_are_read_with_verls_parser(case: str, gpt_oss: dict[str, Any]) -> None:
    text, calls, expected = GPT_OSS[case]
    turn = read(gpt_oss, text)
    assert [(c.name, json.loads(c.arguments)) for c in turn.calls] == [("calculator", {"expression": "1+2"})] * calls
    assert turn.malformed == 0 and len(turn.message.get("tool_calls") or ()) == calls
    r, profile = gpt_oss["renderer"], gpt_oss["profile"]
    content = turn.message["content"]
    assert r.decode(profile.generation_prompt_ids) not in content  # "<|start|>assistant" the prompt wrote
    assert not [s.id for s in profile.stop_ids if r.decode([s.id]) in content]
    assert content == expected


def test_a_gpt_oss_rollout_calling_the_calculator_passes_the_check(gpt_oss: dict[str, Any]) -> None:
    """The loop's own steps (``build_loop_rollout``): a direct call, its answer, then a call after an analysis
    message, its answer, and a final answer; the check reports no defect."""
    r, profile, parser = gpt_oss["renderer"], gpt_oss["profile"], gpt_oss["parser"]
    outputs = [r.encode(t) for t in (CALL, ANALYSIS + CALL, FINAL)]
    loop, rollout = build_loop_rollout(r, profile, parser, outputs, ["3", "3"], response_length=1024, tools=TOOLS)
    assert loop.ended == "last"
    assert [m["role"] for m in loop.trajectory.messages] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]
    result = ConsistencyChecker(r, profile, CheckPolicy(mode="warn")).check_rollout(rollout, template_view=True)
    assert not result.engine_failures, result.summary()
    assert [(f.cause.value, f.turn, f.detail) for f in result.findings if not f.allowed] == []


def test_a_parser_that_reads_the_call_without_the_stop_is_not_given_it(renderer_for: Any) -> None:
    """verl's qwen3_coder parser reads an unclosed parameter up to the end of its text: given the stop, it would
    write ``<|im_end|>`` into the arguments (a fake turn end in the rendered call)."""
    from verl.experimental.agent_loop.tool_parser import ToolParser

    r = renderer_for("qwen3")
    profile = probe_template(r)
    parts = {"renderer": r, "profile": profile, "parser": ToolParser.get_tool_parser("qwen3_coder", r.tokenizer)}
    turn = read(parts, "<tool_call>\n<function=calculator>\n<parameter=expression>\n1+2<|im_end|>")
    assert [(c.name, json.loads(c.arguments)) for c in turn.calls] == [("calculator", {"expression": "1+2"})]
