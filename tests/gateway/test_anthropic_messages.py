"""The Anthropic Messages endpoint driven by the official ``anthropic`` SDK: a tool-use loop (plain and streamed),
the thinking block sent back, the same session continued in the OpenAI shape, a fork from an edited history, stop
sequences, and errors in Anthropic's shape."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from gateway_fixtures import CALL, TOOLS
from sdk_harness import calculate

from verl_ext.gateway.server import ServerThread, create_app
from verl_ext.telemetry.records import read_records

ANSWER = "<think>\nThe tool said %s.\n</think>\n\nThe answer is %s.<|im_end|>"
CALC = {
    "name": "calc",
    "description": "Evaluate an arithmetic expression.",
    "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
}
SYSTEM = "Use the calculator."


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


def client(server: ServerThread, session: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=f"{server.url}/sessions/{session}", api_key="verl-ext", max_retries=0)


def tool_results(message: Any) -> list[dict[str, Any]]:
    """The calculator run on every tool_use block, as a user message's tool_result blocks."""
    return [
        {"type": "tool_result", "tool_use_id": b.id, "content": calculate(b.input["expression"])}
        for b in message.content
        if b.type == "tool_use"
    ]


def test_tool_use_loop_keeps_one_branch_and_the_engine_ids(serve: Any, gateway_parts: Any, tmp_path: Path) -> None:
    turns = [CALL % "6*7", ANSWER % (42, 42)]
    gateway, server = serve(turns)
    sdk = client(server, "loop")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 6*7?"}]
    first = sdk.messages.create(model="tiny-qwen3", max_tokens=64, system=SYSTEM, messages=messages, tools=[CALC])
    assert first.stop_reason == "tool_use" and first.type == "message" and first.role == "assistant"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "calc" and use.input == {"expression": "6*7"}
    tokenizer = gateway_parts["tokenizer"]
    assert first.model_extra["token_ids"] == tokenizer.encode(turns[0], add_special_tokens=False)
    assert first.usage.output_tokens == len(first.model_extra["token_ids"]) and first.usage.input_tokens > 0

    messages += [{"role": "assistant", "content": first.content}, {"role": "user", "content": tool_results(first)}]
    second = sdk.messages.create(model="tiny-qwen3", max_tokens=64, system=SYSTEM, messages=messages, tools=[CALC])
    assert second.stop_reason == "end_turn"
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in second.content] == [
        ("thinking", "The tool said 42."),
        ("text", "The answer is 42."),
    ]
    # the thinking block sent back as it came: the branch goes on (reasoning matches what was sampled)
    messages += [{"role": "assistant", "content": second.content}, {"role": "user", "content": "And 6*8?"}]
    third = sdk.messages.create(model="tiny-qwen3", max_tokens=3, system=SYSTEM, messages=messages, tools=[CALC])
    assert third.stop_reason == "max_tokens" and third.model_extra["verl_ext"]["fork"] is None

    (result,) = gateway.end("loop")
    assert result.result.ok and result.result.engine_ok and gateway.counters["forks"] == 0
    _, (record,) = read_records(sorted((tmp_path / "records").glob("*.jsonl")))
    assert record.check.num_turns == 3 and "fork" not in record.extra["gateway"]
    for call in record.engine_calls:  # the trainer reads the engine's ids at the engine's positions
        where = slice(call.prompt_length, call.prompt_length + len(call.output_ids))
        assert list(record.input_ids[where]) == list(call.output_ids) and set(record.loss_mask[where]) == {1}


def test_streamed_turns_reassemble_in_the_sdk_and_follow_the_event_sequence(serve: Any) -> None:
    _, server = serve([CALL % "2+2", ANSWER % (4, 4)])
    sdk = client(server, "stream")
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2+2?"}]
    with sdk.messages.stream(model="m", max_tokens=64, messages=messages, tools=[CALC]) as stream:
        first = stream.get_final_message()
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.input == {"expression": "2+2"} and first.stop_reason == "tool_use"
    messages += [
        {"role": "assistant", "content": [b.model_dump() for b in first.content]},
        {"role": "user", "content": tool_results(first)},
    ]
    with sdk.messages.stream(model="m", max_tokens=64, messages=messages, tools=[CALC]) as stream:
        text = "".join(stream.text_stream)
        second = stream.get_final_message()
    assert text == "The answer is 4." and second.stop_reason == "end_turn"
    assert second.content[0].type == "thinking" and second.content[0].thinking == "The tool said 4."

    # the raw events, as the Messages API documents their order
    messages += [{"role": "assistant", "content": [b.model_dump() for b in second.content]}]
    messages += [{"role": "user", "content": "Thanks."}]
    body = {"model": "m", "max_tokens": 2, "messages": messages, "tools": [CALC], "stream": True}
    raw = httpx.post(f"{server.url}/sessions/stream/v1/messages", json=body, timeout=60)
    assert raw.headers["content-type"].startswith("text/event-stream")
    events = [block.split("\n") for block in raw.text.strip().split("\n\n")]
    names = [lines[0].removeprefix("event: ") for lines in events]
    datas = [json.loads(lines[1].removeprefix("data: ")) for lines in events]
    assert all(d["type"] == n for n, d in zip(names, datas, strict=True))
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    assert set(names[2:-2]) <= {"content_block_start", "content_block_delta", "content_block_stop"}
    assert datas[-2]["delta"]["stop_reason"] == "max_tokens" and datas[-2]["verl_ext"]["fork"] is None
    assert datas[-2]["usage"]["output_tokens"] == len(datas[-2]["token_ids"]) == 2


def test_one_session_in_both_shapes_and_a_fork_named_by_field(serve: Any) -> None:
    gateway, server = serve([CALL % "6*7", ANSWER % (42, 42)])
    sdk = client(server, "mixed")
    question = {"role": "user", "content": "What is 6*7?"}
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]  # a caching hint: no token
    first = sdk.messages.create(model="m", max_tokens=64, system=system, messages=[question], tools=[CALC])
    (use,) = [b for b in first.content if b.type == "tool_use"]
    # the next turn in the OpenAI shape: the same history, so the same branch
    chat = openai.OpenAI(base_url=f"{server.url}/sessions/mixed/v1", api_key="k", max_retries=0)
    call = {"id": use.id, "type": "function", "function": {"name": "calc", "arguments": json.dumps(use.input)}}
    history = [
        {"role": "system", "content": SYSTEM},
        question,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": use.id, "content": "42"},
    ]
    second = chat.chat.completions.create(model="m", messages=history, tools=TOOLS, max_tokens=64)
    assert second.model_extra["verl_ext"] == {
        "session": "mixed",
        "branch": 0,
        "fork": None,
        "malformed_calls": 0,
        "sampling_overridden": {},
    }
    answer = second.choices[0].message
    assert answer.content == "The answer is 42."
    # forks in the Anthropic shape are named as in the OpenAI shape: an edited question, edited reasoning
    edited = {"role": "user", "content": "What is 6*7? Show your work."}
    third = sdk.messages.create(model="m", max_tokens=64, system=SYSTEM, messages=[edited], tools=[CALC])
    fork = third.model_extra["verl_ext"]["fork"]
    assert fork["parent"] == 0 and fork["message"] == 1 and fork["field"] == "content"
    thinking = {"type": "thinking", "thinking": "I guessed.", "signature": ""}
    history = [
        question,
        {"role": "assistant", "content": [use.model_dump()]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "42", "is_error": False}],
        },
        {"role": "assistant", "content": [thinking, {"type": "text", "text": answer.content}]},
        {"role": "user", "content": "And 6*8?"},
    ]
    fourth = sdk.messages.create(model="m", max_tokens=2, system=SYSTEM, messages=history, tools=[CALC])
    fork = fourth.model_extra["verl_ext"]["fork"]
    assert fork["parent"] == 0 and fork["message"] == 4 and fork["field"] == "reasoning_content"
    summary = httpx.post(f"{server.url}/sessions/mixed/end", timeout=60).json()
    assert [b["fork"] is not None for b in summary["branches"]] == [False, True, True]
    assert all(b["engine_ok"] for b in summary["branches"]) and gateway.counters["forks"] == 2


def test_a_stop_sequence_ends_the_turn_and_is_named(serve: Any) -> None:
    _, server = serve(["Six times seven is 42. Done.<|im_end|>"])
    reply = client(server, "stop").messages.create(
        model="m", max_tokens=32, stop_sequences=["."], messages=[{"role": "user", "content": "6*7?"}]
    )
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == "."
    # the stop token is a sampled token the session keeps, so the text holds it (the client sends it back as is)
    assert [b.text for b in reply.content] == ["Six times seven is 42."]


def test_errors_are_anthropic_shaped(serve: Any) -> None:
    _, server = serve([CALL % "1"], open_on_demand=False)
    with pytest.raises(anthropic.NotFoundError) as unknown:
        client(server, "never").messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    assert unknown.value.body["type"] == "error" and unknown.value.body["error"]["type"] == "not_found_error"
    httpx.post(f"{server.url}/sessions/s/open").raise_for_status()
    sdk = client(server, "s")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}}
    cases = [
        ({"messages": [{"role": "user", "content": [image]}]}, "content[0].source: the bytes cannot be decoded"),
        ({"tool_choice": {"type": "any"}, "tools": [CALC]}, "tool_choice"),
        ({"extra_body": {"top_k": 0.5}}, "'top_k' must be an integer"),  # top_k is honoured (the SDK dropped it)
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, "'thinking.budget_tokens' must be an integer"),
        ({"stop_sequences": ["Hello world"]}, "stop_sequences entry 'Hello world' is 2 tokens"),
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0] is a server tool"),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "1"}]}]},
            "tool_use_id 't1' answers no tool_use block",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "The answer is"}]},
            "prefill",
        ),
    ]
    for extra, words in cases:
        kwargs = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}], **extra}
        with pytest.raises(anthropic.BadRequestError) as bad:
            sdk.messages.create(**kwargs)
        body = bad.value.body
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
        assert words in body["error"]["message"], (words, body)
    missing = httpx.post(f"{server.url}/sessions/s/v1/messages", json={"messages": [{"role": "user", "content": "x"}]})
    assert missing.status_code == 400 and "'max_tokens' is required" in missing.json()["error"]["message"]
    assert "None" not in missing.json()["error"]["message"]
    raw = httpx.post(f"{server.url}/sessions/s/v1/messages", content=b'{"messages": "\xff"}')
    assert raw.status_code == 400 and raw.json()["error"]["type"] == "invalid_request_error"
    assert raw.json()["verl_ext"]["code"] == "invalid_json"
    sdk.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    httpx.post(f"{server.url}/sessions/s/end", timeout=60).raise_for_status()
    with pytest.raises(anthropic.ConflictError) as ended:
        sdk.messages.create(model="m", max_tokens=4, messages=[{"role": "user", "content": "x"}])
    assert ended.value.body["verl_ext"]["code"] == "session_finished" and "has ended" in ended.value.message
