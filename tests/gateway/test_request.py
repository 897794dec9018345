"""Request bodies: each malformed field is a 400 naming it; the core modules import neither verl nor Ray."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

from verl_ext.gateway.errors import GatewayError
from verl_ext.gateway.history import canonical_arguments, divergence
from verl_ext.gateway.request import parse_chat_request

USER = {"role": "user", "content": "hi"}


def refused(body: Any) -> GatewayError:
    with pytest.raises(GatewayError) as info:
        parse_chat_request(body).messages.check_all()  # messages are checked when read
    assert info.value.status == 400
    assert info.value.body()["error"]["type"] == "invalid_request_error"
    return info.value


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [USER], "n": 2}, "n"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"messages": [USER, {"role": "tool", "tool_call_id": "c1", "content": "3"}]}, "messages[1].tool_call_id"),
        ({"messages": [USER, {"role": "tool", "content": "3"}]}, "messages[1].tool_call_id"),
        ({"messages": [USER], "tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name"),
        (
            {"messages": [USER], "tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]},
            "tools[0].function.parameters",
        ),
        ({"messages": [USER], "tools": [{"type": "retrieval"}]}, "tools[0]"),
        ({"messages": [USER], "max_tokens": 0}, "max_tokens"),
        ({"messages": [USER], "temperature": 3}, "temperature"),
        ({"messages": [USER], "logprobs": True}, "logprobs"),
        ({"messages": [USER], "tool_choice": "required"}, "tool_choice"),
        ({"messages": [USER], "parallel_tool_calls": False}, "parallel_tool_calls"),
        ({"messages": [USER, {"role": "assistant", "content": "x"}]}, "messages[1]"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0]"),
    ],
)
def test_malformed_field_is_named(body: dict[str, Any], param: str) -> None:
    assert refused(body).param == param


def test_parallel_tool_calls_true_is_served() -> None:
    assert parse_chat_request({"messages": [USER], "parallel_tool_calls": True}).tool_choice == "auto"


def test_body_must_be_an_object() -> None:
    assert refused([USER]).param is None


def test_messages_are_normalized() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    request = parse_chat_request(
        {
            "messages": [
                {"role": "developer", "content": [{"type": "text", "text": "be "}, {"type": "text", "text": "brief"}]},
                USER,
                {"role": "assistant", "content": None, "tool_calls": [call], "reasoning": "think"},
                {"role": "tool", "tool_call_id": "c1", "content": "2"},
            ],
            "max_completion_tokens": 5,
        }
    )
    system, _, assistant, _ = request.messages
    assert system == {"role": "system", "content": "be brief"}
    assert assistant["content"] == "" and assistant["reasoning_content"] == "think"
    assert request.max_tokens == 5


def test_arguments_compare_as_parsed_json() -> None:
    assert canonical_arguments('{"b": 2, "a": 1}') == canonical_arguments('{"a":1,"b":2}')
    assert canonical_arguments('{"a": 1}') != canonical_arguments('{"a": 2}')
    assert canonical_arguments("not json") == "not json"


def test_divergence_names_the_field() -> None:
    held = [USER, {"role": "assistant", "content": "a", "tool_calls": []}]
    assert divergence([USER, {"role": "assistant", "content": "b"}], held, 1).field == "content"
    assert divergence([{"role": "system", "content": "hi"}], held, 0).field == "role"
    assert divergence([USER], held, 1).field == "missing"


def test_core_modules_import_neither_verl_nor_ray() -> None:
    code = (
        "import sys\n"
        "import verl_ext.gateway.session, verl_ext.gateway.request, verl_ext.gateway.conclude\n"
        "import verl_ext.gateway.service, verl_ext.gateway.parsing, verl_ext.gateway.server\n"
        "print(sorted(m for m in ('verl', 'ray', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
