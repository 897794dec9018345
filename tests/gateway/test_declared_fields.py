"""Every nested key the SDKs' request types declare (openai.types.chat / openai.types.responses /
anthropic.types), sent through the official clients, is served: the gateway refuses keys outside those types
(tests/bad_inputs.py), and these requests prove the allowed lists are not narrower than the APIs'."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest
from gateway_fixtures import CALL, TOOLS

from verl_ext.gateway.server import ServerThread, create_app

ANSWER = "<think>\nThe tool said 42.\n</think>\n\nThe answer is 42.<|im_end|>"
ARGUMENTS = json.dumps({"expression": "6*7"})
FUNCTION = TOOLS[0]["function"]


@pytest.fixture
def server(make_gateway: Any) -> Iterator[ServerThread]:
    """A gateway whose second assistant turn (the one answering the tool result) is ``ANSWER``; a first turn is
    the calculator call."""
    started = ServerThread(create_app(make_gateway([CALL % "6*7", ANSWER]), "tiny-qwen3")).start()
    yield started
    started.stop()


def test_chat_messages_tools_and_stream_options_with_every_declared_key(server: ServerThread) -> None:
    sdk = openai.OpenAI(base_url=f"{server.url}/sessions/chat/v1", api_key="k", max_retries=0, timeout=120)
    call = {"id": "call_1", "type": "function", "function": {"name": "calc", "arguments": ARGUMENTS}}
    messages: list[Any] = [
        {"role": "system", "content": "Be exact.", "name": "rules"},
        {"role": "developer", "content": [{"type": "text", "text": "Use the calculator."}], "name": "harness"},
        {"role": "user", "content": "What is 6*7?", "name": "ann"},
        {
            "role": "assistant",
            "content": None,
            "name": "solver",
            "tool_calls": [call],
            "refusal": None,
            "audio": None,
            "reasoning_content": "I use the tool.",
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "42", "name": "calc"},
    ]
    stream = sdk.chat.completions.create(
        model="m",
        messages=messages,
        tools=[{"type": "function", "function": {**FUNCTION, "strict": False}}],
        max_tokens=64,
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "The answer is 42."
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0


def test_responses_items_tools_and_include_with_every_declared_key(server: ServerThread) -> None:
    sdk = openai.OpenAI(base_url=f"{server.url}/sessions/responses/v1", api_key="k", max_retries=0, timeout=120)
    items: list[Any] = [
        {"type": "message", "role": "developer", "content": "Use the calculator."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "6*7?"}], "status": "completed"},
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": "I use the tool."}],
            "encrypted_content": None,
            "status": "completed",
        },
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "status": "completed",
            "content": [{"type": "output_text", "text": "Let me compute.", "annotations": []}],
        },
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "c1",
            "name": "calc",
            "arguments": ARGUMENTS,
            "status": "completed",
        },
        {"type": "function_call_output", "id": "fco_1", "call_id": "c1", "output": "42", "status": "completed"},
    ]
    response = sdk.responses.create(
        model="m",
        input=items,
        instructions="Be exact.",
        tools=[{"type": "function", **FUNCTION, "strict": False}],
        include=["reasoning.encrypted_content"],
        max_output_tokens=64,
    )
    assert response.status == "completed" and response.output_text == "The answer is 42."


def test_messages_tools_and_tool_choice_with_every_declared_key(server: ServerThread) -> None:
    sdk = anthropic.Anthropic(base_url=f"{server.url}/sessions/messages", api_key="k", max_retries=0)
    tool = {
        "type": "custom",
        "name": "calc",
        "description": FUNCTION["description"],
        "input_schema": FUNCTION["parameters"],
        "cache_control": {"type": "ephemeral"},
        "strict": False,
        "eager_input_streaming": None,
        "defer_loading": False,
        "allowed_callers": ["direct"],
        "input_examples": [],
    }
    reply = sdk.messages.create(
        model="m",
        max_tokens=64,
        messages=[{"role": "user", "content": "What is 6*7?"}],
        tools=[tool],
        tool_choice={"type": "auto", "disable_parallel_tool_use": False},
    )
    (use,) = [b for b in reply.content if b.type == "tool_use"]
    assert reply.stop_reason == "tool_use" and use.name == "calc" and use.input == {"expression": "6*7"}
    done = sdk.messages.create(
        model="m",
        max_tokens=64,
        messages=[
            {"role": "user", "content": "What is 6*7?"},
            {"role": "assistant", "content": [use.model_dump()]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "42"}]},
        ],
        tools=[tool],
        tool_choice={"type": "none"},
    )
    assert [b.text for b in done.content if b.type == "text"] == ["The answer is 42."]
