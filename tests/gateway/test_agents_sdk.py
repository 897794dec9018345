"""The gateway driven by the OpenAI Agents SDK, a harness nobody here wrote: an agent with a function tool (the
calculator) on the SDK's chat-completions model, run plain and streamed. The session's record must hold the
engine's ids where the trainer reads them, pass the check, and show no fork (the SDK rebuilds every request from
its own items: it drops the reasoning, re-serializes the tool call, and sends an empty content as "")."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from gateway_fixtures import CALL
from openai import AsyncOpenAI
from sdk_harness import calculate

from verl_ext.gateway.server import ServerThread, create_app
from verl_ext.telemetry.records import read_records

ANSWER = "<think>\nThe tool said %s.\n</think>\n\nThe answer is %s.<|im_end|>"


@function_tool
def calc(expression: str) -> str:
    """Evaluate an arithmetic expression."""
    return calculate(expression)


async def _run_agent(base_url: str, stream: bool) -> Any:
    client = AsyncOpenAI(base_url=base_url, api_key="verl-ext", max_retries=0, timeout=120)
    agent = Agent(
        name="calculator",
        instructions="Use the calculator for arithmetic.",
        tools=[calc],
        model=OpenAIChatCompletionsModel("tiny-qwen3", client),
        model_settings=ModelSettings(max_tokens=64),
    )
    if not stream:
        return await Runner.run(agent, "What is 6*7?")
    result = Runner.run_streamed(agent, "What is 6*7?")
    async for _ in result.stream_events():
        pass
    return result


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_agents_sdk_agent_keeps_the_engine_ids_without_forking(
    make_gateway: Any, gateway_parts: dict[str, Any], tmp_path: Path, stream: bool
) -> None:
    set_tracing_disabled(True)  # the SDK would export traces to OpenAI's servers
    turns = [CALL % "6*7", ANSWER % (42, 42)]
    gateway = make_gateway(turns)
    server = ServerThread(create_app(gateway, "tiny-qwen3")).start()
    try:
        result = asyncio.run(_run_agent(f"{server.url}/sessions/agent/v1", stream))
    finally:
        server.stop()
    assert result.final_output == "The answer is 42."
    outputs = [i.raw_item for i in result.new_items if type(i).__name__ == "ToolCallOutputItem"]
    assert [o["output"] for o in outputs] == ["42"]  # the SDK ran the calculator on the parsed call

    branches = gateway.sessions["agent"].branches  # the gateway releases a session once it has ended
    (summary,) = gateway.end("agent")
    assert summary.result.ok and summary.result.engine_ok, summary.result
    assert gateway.counters["forks"] == 0 and len(branches) == 1
    _, (record,) = read_records(sorted((tmp_path / "records").glob("*.jsonl")))
    assert record.check.ok and record.check.engine_ok and record.check.num_turns == 2
    assert "fork" not in record.extra["gateway"]
    tokenizer = gateway_parts["tokenizer"]
    expected = [tokenizer.encode(text, add_special_tokens=False) for text in turns]
    assert [list(c.output_ids) for c in record.engine_calls] == expected  # what the engine sampled, as sampled
    for call in record.engine_calls:  # ... is what the trainer reads, trained on, at the engine's positions
        where = slice(call.prompt_length, call.prompt_length + len(call.output_ids))
        assert list(record.input_ids[where]) == list(call.output_ids)
        assert set(record.loss_mask[where]) == {1}
