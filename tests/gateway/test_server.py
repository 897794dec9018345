"""The HTTP gateway driven by the official OpenAI SDK: non-stream, stream, a ReAct agent, forks, errors, 64
concurrent sessions, and records that ``verl-ext report`` reads."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gateway_fixtures import CALL, TOOLS
from sdk_harness import react_calculator

from verl_ext.gateway.server import ServerThread, create_app

ANSWER = "<think>\nThe tool said %s.\n</think>\n\nThe answer is %s.<|im_end|>"


@pytest.fixture
def serve(make_gateway: Any) -> Any:
    servers: list[ServerThread] = []

    def start(turns: list[str], **config: Any) -> tuple[Any, ServerThread]:
        gateway = make_gateway(turns, **config)
        server = ServerThread(create_app(gateway, "tiny-qwen3")).start()
        servers.append(server)
        return gateway, server

    yield start
    for server in servers:
        server.stop()


def client(server: ServerThread, session: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/sessions/{session}/v1", api_key="verl-ext", max_retries=0)


def end(server: ServerThread, session: str) -> dict[str, Any]:
    response = httpx.post(f"{server.url}/sessions/{session}/end", timeout=60)
    response.raise_for_status()
    return response.json()


def test_non_stream_turn_with_tool_call(serve: Any, gateway_parts: Any) -> None:
    _, server = serve([CALL % "6*7"])
    sdk = client(server, "a")
    assert [m.id for m in sdk.models.list().data] == ["tiny-qwen3"]
    response = sdk.chat.completions.create(
        model="tiny-qwen3", messages=[{"role": "user", "content": "6*7?"}], tools=TOOLS, max_tokens=64
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].function.name == "calc"
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"expression": "6*7"}
    token_ids = choice.model_extra["token_ids"]
    assert token_ids == gateway_parts["tokenizer"].encode(CALL % "6*7", add_special_tokens=False)
    assert response.usage.completion_tokens == len(token_ids)
    assert response.usage.prompt_tokens > 0


def test_stream_turn_reassembles_in_the_sdk(serve: Any) -> None:
    _, server = serve([ANSWER % (1, 1)])
    stream = client(server, "b").chat.completions.create(
        model="tiny-qwen3",
        messages=[{"role": "user", "content": "1?"}],
        tools=TOOLS,
        stream=True,
        stream_options={"include_usage": True},
    )
    content, finish, usage = "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert content == "The answer is 1." and finish == "stop"
    assert usage is not None and usage.completion_tokens > 0


def test_stream_tool_call_with_the_sdk_helper(serve: Any) -> None:
    _, server = serve([CALL % "2+2"])
    sdk = client(server, "c")
    with sdk.chat.completions.stream(
        model="tiny-qwen3", messages=[{"role": "user", "content": "2+2?"}], tools=TOOLS
    ) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    call = final.choices[0].message.tool_calls[0]
    assert json.loads(call.function.arguments) == {"expression": "2+2"}
    assert final.choices[0].finish_reason == "tool_calls"


def test_react_agent_drops_reasoning_and_reserializes_without_forking(serve: Any, tmp_path: Path) -> None:
    gateway, server = serve([CALL % "6*7", ANSWER % (42, 42)])
    out = react_calculator(client(server, "react"), "What is 6*7?", TOOLS)
    assert out["answer"] == "The answer is 42."
    assert out["messages"][3] == {"role": "tool", "tool_call_id": "c00000000", "content": "42"}
    summary = end(server, "react")
    (branch,) = summary["branches"]
    assert branch["engine_ok"] and branch["fork"] is None and branch["turns"] == 2
    assert gateway.counters["forks"] == 0


def test_harness_that_edits_history_forks_exactly_once(serve: Any) -> None:
    gateway, server = serve([CALL % "6*7", ANSWER % (42, 42)])
    sdk = client(server, "edit")
    out = react_calculator(sdk, "What is 6*7?", TOOLS)
    messages = out["messages"][:-1]
    messages[1] = {"role": "user", "content": "What is 6*7? Show your work."}
    response = sdk.chat.completions.create(model="tiny-qwen3", messages=messages, tools=TOOLS, max_tokens=64)
    fork = response.model_extra["verl_ext"]["fork"]
    assert fork["message"] == 1 and fork["field"] == "content" and fork["parent"] == 0
    summary = end(server, "edit")
    assert [b["fork"] is not None for b in summary["branches"]] == [False, True]
    assert all(b["engine_ok"] for b in summary["branches"])
    assert gateway.counters["forks"] == 1


def test_errors_are_openai_shaped(serve: Any) -> None:
    _, server = serve([CALL % "1"], open_on_demand=False)
    with pytest.raises(openai.NotFoundError):
        client(server, "never-opened").chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    httpx.post(f"{server.url}/sessions/s/open").raise_for_status()
    sdk = client(server, "s")
    with pytest.raises(openai.BadRequestError) as n:
        sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], n=2)
    assert n.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as role:
        sdk.chat.completions.create(model="m", messages=[{"role": "wizard", "content": "x"}])
    assert role.value.body["param"] == "messages[0].role"
    raw = httpx.post(f"{server.url}/sessions/s/v1/chat/completions", content=b'{"messages": "\xff"}')
    assert raw.status_code == 400 and raw.json()["error"]["code"] == "invalid_json"
    sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=8)
    end(server, "s")
    with pytest.raises(openai.ConflictError) as ended:
        sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert ended.value.body["code"] == "session_finished"


def test_64_concurrent_sessions_are_isolated(serve: Any, tmp_path: Path) -> None:
    gateway, server = serve([CALL % "1+1"])

    async def one(k: int) -> Any:
        sdk = openai.AsyncOpenAI(base_url=f"{server.url}/sessions/s{k}/v1", api_key="x", max_retries=0, timeout=300)
        messages = [{"role": "user", "content": f"session {k}"}]
        first = await sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=32)
        call = first.choices[0].message.tool_calls[0]
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": f"result {k}"},
        ]
        await sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=4, seed=k)
        await sdk.close()

    async def all_sessions() -> None:
        await asyncio.gather(*(one(k) for k in range(64)))

    asyncio.run(all_sessions())
    for k in range(64):
        session = gateway.sessions[f"s{k}"]  # the gateway releases a session once it has ended
        summary = end(server, f"s{k}")
        (branch,) = summary["branches"]
        assert branch["engine_ok"] and branch["fork"] is None, branch
        text = gateway.renderer.decode(session.branches[0].trajectory.input_ids)
        assert f"session {k}<" in text and f"result {k}\n" in text  # the user message, the tool result
        others = [j for j in range(64) if j != k and (f"session {j}<" in text or f"result {j}\n" in text)]
        assert not others
    assert gateway.counters["forks"] == 0 and gateway.counters["turns"] == 128


def test_records_feed_the_report(serve: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from verl_ext.cli.main import main

    _, server = serve([CALL % "6*7", ANSWER % (42, 42)])
    react_calculator(client(server, "r"), "What is 6*7?", TOOLS)
    end(server, "r")
    records = sorted((tmp_path / "records").glob("*.jsonl"))
    assert records
    html = tmp_path / "report.html"
    assert main(["report", *map(str, records), "-o", str(html)]) == 0
    printed = capsys.readouterr().out
    assert "1 rollout" in printed and "0 engine-view failures" in printed, printed
