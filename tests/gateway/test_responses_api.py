"""The Responses API (``/sessions/{id}/v1/responses``) driven by the official openai SDK and the OpenAI Agents SDK's
default model class: function calls and their outputs, reasoning items, streaming, one branch per conversation, and
records the check passes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest
from gateway_fixtures import CALL, TOOLS
from sdk_harness import calculate

from verl_ext.gateway.server import ServerThread, create_app

ANSWER = "<think>\nThe tool said %s.\n</think>\n\nThe answer is %s.<|im_end|>"
TOOL = {"type": "function", **TOOLS[0]["function"]}


@pytest.fixture
def serve(make_gateway: Any) -> Any:
    servers: list[ServerThread] = []

    def start(turns: list[str]) -> tuple[Any, ServerThread]:
        gateway = make_gateway(turns)
        server = ServerThread(create_app(gateway, "tiny-qwen3")).start()
        servers.append(server)
        return gateway, server

    yield start
    for server in servers:
        server.stop()


def _client(server: ServerThread, session: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/sessions/{session}/v1", api_key="k", max_retries=0, timeout=120)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_a_tool_call_and_its_output_continue_one_branch(serve: Any, gateway_parts: Any, stream: bool) -> None:
    gateway, server = serve([CALL % "6*7", ANSWER % (42, 42), "Glad to help.<|im_end|>"])
    sdk = _client(server, "r")

    def create(items: list[Any]) -> Any:
        kwargs = {"model": "m", "input": items, "tools": [TOOL], "max_output_tokens": 64, "instructions": "Be exact."}
        if not stream:
            return sdk.responses.create(**kwargs)
        with sdk.responses.stream(**kwargs) as events:
            kinds = [event.type for event in events]
            final = events.get_final_response()
        assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
        return final

    items: list[Any] = [{"role": "user", "content": "What is 6*7?"}]
    first = create(items)
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "calc" and json.loads(call.arguments) == {"expression": "6*7"}
    assert first.status == "completed" and first.usage.output_tokens == len(first.model_extra["token_ids"])
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": calculate("6*7")})
    second = create(items)
    assert second.output_text == "The answer is 42."
    (reasoning,) = [item for item in second.output if item.type == "reasoning"]
    assert reasoning.content[0].text == "The tool said 42."
    assert second.model_extra["verl_ext"]["fork"] is None and second.model_extra["verl_ext"]["branch"] == 0

    # the reasoning item sent back matches the sampled reasoning: a third request continues the same branch
    items += [item.model_dump(exclude_none=True) for item in second.output]
    items.append({"role": "user", "content": "Thanks."})
    third = create(items)
    assert third.model_extra["verl_ext"]["fork"] is None

    session = gateway.sessions["r"]  # the gateway releases a session once it has ended
    (summary, *_) = gateway.end("r")
    assert summary.result.ok and summary.result.engine_ok and summary.result.num_turns == 3, summary.result
    assert len(session.branches) == 1
    tokenizer = gateway_parts["tokenizer"]
    assert list(session.branches[0].calls[0].output_ids) == tokenizer.encode(CALL % "6*7", add_special_tokens=False)


def test_a_cut_turn_is_incomplete(serve: Any) -> None:
    _, server = serve([ANSWER % (1, 1)])
    response = _client(server, "cut").responses.create(model="m", input="1?", max_output_tokens=3)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"


def test_errors_are_openai_shaped(serve: Any) -> None:
    _, server = serve([])
    sdk = _client(server, "e")
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.responses.create(model="m", input="x", tools=[{"type": "web_search"}])
    assert bad.value.body["param"] == "tools[0].type"
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.responses.create(model="m", input="x", previous_response_id="resp_1")
    assert bad.value.body["param"] == "previous_response_id"


def test_the_agents_sdk_default_responses_model_runs_through_the_gateway(serve: Any) -> None:
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)  # the SDK would export traces to OpenAI's servers

    @function_tool
    def calc(expression: str) -> str:
        """Evaluate an arithmetic expression."""
        return calculate(expression)

    gateway, server = serve([CALL % "6*7", ANSWER % (42, 42)])
    client = openai.AsyncOpenAI(base_url=f"{server.url}/sessions/agent/v1", api_key="k", max_retries=0, timeout=120)
    agent = Agent(
        name="calculator",
        instructions="Use the calculator for arithmetic.",
        tools=[calc],
        model=OpenAIResponsesModel("tiny-qwen3", client),
        model_settings=ModelSettings(max_tokens=64),
    )
    result = asyncio.run(Runner.run(agent, "What is 6*7?"))
    assert result.final_output == "The answer is 42."
    (summary,) = gateway.end("agent")
    assert summary.result.ok and summary.result.engine_ok and summary.result.num_turns == 2, summary.result
    assert gateway.counters["forks"] == 0
