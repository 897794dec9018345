"""One parse step: the gateway and ``verl_ext_tool_agent`` read the same sampled ids identically (the real Qwen3
tokenizer, verl's real hermes parser): the same message for the template, the same calls (the gateway returns
every call; the loop runs up to ``max_parallel_calls`` and answers the rest with an error), the same count of
malformed calls, and, through a whole conversation, the same token stream."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest
from gateway_fixtures import TOOLS
from loop_rollouts import build_loop_rollout

from verl_ext.core import turn_parse
from verl_ext.core.turn_end import end_of_turn_ids
from verl_ext.core.turn_parse import ParsedTurn
from verl_ext.gateway.request import parse_chat_request

THINK = "<think>\nI will use the calculator.\n</think>\n\n"
CALL = '<tool_call>\n{"name": "calc", "arguments": {"expression": "%s"}}\n</tool_call>'
MALFORMED = '<tool_call>\n{"name": calc, "arguments": }\n</tool_call>'
END = "<|im_end|>"
TEXTS = {
    "answer": THINK + "The answer is 42." + END,
    "one call": THINK + CALL % "6*7" + END,
    "two calls": CALL % "6*7" + "\n" + CALL % "1+1" + END,
    "malformed and a call": THINK + MALFORMED + "\n" + CALL % "2**10" + END,
    "only malformed": MALFORMED + END,
    "unicode arguments": "Let me check. " + CALL % "π × 2 — ü" + END,
    "three calls, no stop": CALL % "1" + CALL % "2" + CALL % "3",
}
EXPECTED = {  # (calls, malformed): what each text is, so that a case cannot silently test something else
    "answer": (0, 0),
    "one call": (1, 0),
    "two calls": (2, 0),
    "malformed and a call": (1, 1),
    "only malformed": (0, 1),
    "unicode arguments": (1, 0),
    "three calls, no stop": (3, 0),
}
LOOP_LIMIT = 1  # the loop's max_parallel_calls: calls past it are answered with an error, never run


@pytest.fixture(scope="module")
def readers(gateway_parts: dict[str, Any]) -> dict[str, Any]:
    """The loop's parser and schemas (verl's hermes parser, verl's tool schemas), and the gateway's reader."""
    from verl.experimental.agent_loop.tool_parser import ToolParser
    from verl.tools.schemas import OpenAIFunctionToolSchema

    return {
        "loop_parser": ToolParser.get_tool_parser("hermes", gateway_parts["tokenizer"]),
        "schemas": [OpenAIFunctionToolSchema.model_validate(t) for t in TOOLS],
        "gateway": gateway_parts["reader"],
        "end_ids": end_of_turn_ids(gateway_parts["profile"]),
        "decode": gateway_parts["renderer"].decode,
        "generation_prompt": gateway_parts["profile"].generation_prompt_ids,
    }


def loop_reading(r: dict[str, Any], ids: Sequence[int], turn: int) -> ParsedTurn:
    """``VerlExtToolAgentLoop._parse``'s call, as the loop makes it."""
    from verl_ext.plugin.tool_calls import parse_turn

    gen = r["generation_prompt"]
    return asyncio.run(
        parse_turn(
            r["loop_parser"], ids, r["end_ids"], r["decode"], r["schemas"], turn, LOOP_LIMIT, generation_prompt=gen
        )
    )


def gateway_reading(r: dict[str, Any], ids: Sequence[int], turn: int) -> ParsedTurn:
    return asyncio.run(r["gateway"].read(ids, r["end_ids"], TOOLS, turn, r["decode"], True, r["generation_prompt"]))


def differences(loop: ParsedTurn, gateway: ParsedTurn) -> list[str]:
    """Where the gateway's reading departs from the loop's (empty: the same reading)."""
    out = []
    if gateway.message != loop.message:
        out.append(f"message: {loop.message} -> {gateway.message}")
    if gateway.calls != [*loop.calls, *loop.dropped] or gateway.dropped:
        out.append(f"calls: {loop.calls} + dropped {loop.dropped} -> {gateway.calls} + dropped {gateway.dropped}")
    if gateway.malformed != loop.malformed:
        out.append(f"malformed: {loop.malformed} -> {gateway.malformed}")
    return out


def test_both_call_the_one_parse_function() -> None:
    from verl_ext.gateway import parsing
    from verl_ext.plugin import agent_loop, tool_calls

    assert agent_loop.parse_turn is tool_calls.parse_turn is parsing.parse_turn is turn_parse.parse_turn


@pytest.mark.parametrize("case", sorted(TEXTS))
def test_gateway_reads_sampled_ids_as_the_loop_does(case: str, readers: dict[str, Any], gateway_parts: Any) -> None:
    ids = gateway_parts["tokenizer"].encode(TEXTS[case], add_special_tokens=False)
    loop, gateway = loop_reading(readers, ids, 3), gateway_reading(readers, ids, 3)
    assert differences(loop, gateway) == []
    calls, malformed = EXPECTED[case]
    assert (len(gateway.calls), gateway.malformed) == (calls, malformed)
    assert len(loop.calls) == min(calls, LOOP_LIMIT) and len(loop.dropped) == max(0, calls - LOOP_LIMIT)
    assert len(gateway.message.get("tool_calls") or ()) == calls  # every sampled call stays in the message
    if "<think>" in TEXTS[case]:
        assert gateway.message["content"].startswith("<think>")  # reasoning kept as sampled, for the template


def test_differences_catch_a_reading_that_departs(readers: dict[str, Any], gateway_parts: Any) -> None:
    """Mutations of the gateway's reading that ``differences`` must catch: calls cut at a limit, reasoning
    stripped from the template's message, malformed calls not counted."""
    ids = gateway_parts["tokenizer"].encode(THINK + CALL % "1" + MALFORMED + CALL % "2" + END, add_special_tokens=False)
    loop, gateway = loop_reading(readers, ids, 0), gateway_reading(readers, ids, 0)
    assert differences(loop, gateway) == []
    cut = ParsedTurn(gateway.message, gateway.calls[:1], gateway.calls[1:], gateway.malformed)
    stripped = ParsedTurn(
        {**gateway.message, "content": gateway.message["content"].split("</think>")[-1]},
        gateway.calls,
        [],
        gateway.malformed,
    )
    uncounted = ParsedTurn(gateway.message, gateway.calls, [], 0)
    assert [len(differences(loop, m)) for m in (cut, stripped, uncounted)] == [1, 1, 1]


def test_tool_choice_none_keeps_the_text_whole(readers: dict[str, Any], gateway_parts: Any) -> None:
    text = CALL % "6*7"
    ids = gateway_parts["tokenizer"].encode(text + END, add_special_tokens=False)
    read = readers["gateway"].read(
        ids, readers["end_ids"], TOOLS, 0, readers["decode"], False, readers["generation_prompt"]
    )
    turn = asyncio.run(read)
    assert (turn.message, turn.calls, turn.malformed) == ({"role": "assistant", "content": text}, [], 0)


def test_a_conversation_keeps_the_loops_token_stream(make_gateway: Any, gateway_parts: Any) -> None:
    """Two calls and a malformed block, then an answer: the gateway's branch holds the token stream, messages and
    engine ids the loop builds from the same sampled ids (the harness answers both calls, as the loop does with
    ``max_parallel_calls`` 2; the malformed block is the harness's to answer, the client gets its count, so the loop
    here does not answer it either); the client gets both calls and the malformed count."""
    first = THINK + CALL % "6*7" + "\n" + MALFORMED + "\n" + CALL % "1+1" + END
    second = "<think>\nBoth are known.\n</think>\n\n42 and 2." + END
    gateway = make_gateway([first, second])
    prompt = [{"role": "user", "content": "What are 6*7 and 1+1?"}]

    def ask(messages: list[dict[str, Any]]) -> Any:
        body = {"messages": messages, "tools": TOOLS, "max_tokens": 128}
        return asyncio.run(gateway.complete("s", parse_chat_request(body)))

    done = ask(prompt)
    assert done.finish_reason == "tool_calls" and done.malformed_calls == 1
    calls = done.message["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"expression": "6*7"}, {"expression": "1+1"}]
    results = ["42", "2"]
    replies = [
        {"role": "tool", "tool_call_id": c["id"], "name": c["function"]["name"], "content": r}
        for c, r in zip(calls, results, strict=True)
    ]
    assert ask([*prompt, {**done.message}, *replies]).finish_reason == "stop"
    assert gateway.counters["malformed_calls"] == 1 and gateway.counters["forks"] == 0

    tokenizer, renderer, profile = gateway_parts["tokenizer"], gateway_parts["renderer"], gateway_parts["profile"]
    branch = gateway.sessions["s"].branches[0]
    outputs = [list(c.output_ids) for c in branch.calls]
    assert outputs == [tokenizer.encode(t, add_special_tokens=False) for t in (first, second)]
    loop, _ = build_loop_rollout(
        renderer,
        profile,
        gateway_parts["reader"].parser,
        outputs,
        results,
        response_length=1024,
        tools=TOOLS,
        prompt=prompt,
        max_parallel_calls=2,
        answer_malformed=False,
    )
    assert loop.ended == "last"
    assert branch.trajectory.input_ids == loop.trajectory.input_ids
    assert branch.trajectory.messages == loop.trajectory.messages
    assert [list(c.prompt_ids) for c in branch.calls] == [list(c.prompt_ids) for c in loop.calls]


def test_the_gateway_answers_the_reading_that_leaves_no_call_text_and_counts_the_disagreement(make_gateway: Any):
    """A ``</tool_call>`` inside a string argument: verl's hermes parser cuts the call there, the derived reader
    decodes it; the client gets both calls and no leftover marker in the content, and the gateway counts the turn in
    ``readings_disagree`` (once: an agreeing turn is not counted)."""
    marked = '<tool_call>\n{"name": "calc", "arguments": {"expression": "a </tool_call> b"}}\n</tool_call>'
    gateway = make_gateway([CALL % "6*7" + "\n" + marked + END, CALL % "1+1" + END])
    prompt = [{"role": "user", "content": "What is 6*7?"}]
    done = asyncio.run(gateway.complete("s", parse_chat_request({"messages": prompt, "tools": TOOLS})))
    calls = [json.loads(c["function"]["arguments"]) for c in done.message["tool_calls"]]
    assert calls == [{"expression": "6*7"}, {"expression": "a </tool_call> b"}], done.message
    assert "tool_call>" not in (done.message["content"] or "") and done.malformed_calls == 0
    assert gateway.counters["readings_disagree"] == 1 and gateway.counters["derived_reads"] == 1
    replies = [
        {"role": "tool", "tool_call_id": c["id"], "name": "calc", "content": "42"} for c in done.message["tool_calls"]
    ]
    body = {"messages": [*prompt, {**done.message}, *replies], "tools": TOOLS}
    asyncio.run(gateway.complete("s", parse_chat_request(body)))
    assert gateway.counters["readings_disagree"] == 1
