"""Hostile requests against a real ``verl-ext gateway`` (one server for the module): wrong types, missing fields,
huge values, NaN and infinities, bad JSON, lone surrogates, unknown paths, wrong methods, oversized bodies, tool
schemas as the APIs accept them, on the chat, Responses and Anthropic routes. Each is a 4xx in the API's error shape
naming the field, or a success; never a 5xx, never a plain-text body; and the session serves a good request after.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
USER = [{"role": "user", "content": "Hi"}]
CHAT = {"model": "m", "messages": USER, "max_tokens": 2}
RESPONSES = {"model": "m", "input": "Hi", "max_output_tokens": 2}
MESSAGES = {"model": "m", "max_tokens": 2, "messages": USER}
ROUTES = {
    "chat": ("v1/chat/completions", CHAT),
    "responses": ("v1/responses", RESPONSES),
    "messages": ("v1/messages", MESSAGES),
}


def _tool(**function: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", **function}}


OPTIONAL = {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}
NESTED = {
    "type": "object",
    "properties": {"point": {"$ref": "#/$defs/Point"}, "n": OPTIONAL},
    "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
    "required": ["point"],
}
# Tool definitions the OpenAI API accepts (items 1 of issue 31): each is served.
ACCEPTED_TOOLS = {
    "no description": [_tool(parameters={"type": "object", "properties": {}})],
    "null description": [_tool(description=None, parameters={"type": "object", "properties": {}})],
    "no properties": [_tool(description="d", parameters={"type": "object"})],
    "no parameters": [_tool(description="d")],
    "optional argument": [_tool(parameters={"type": "object", "properties": {"n": OPTIONAL}})],
    "nested $ref": [_tool(parameters=NESTED)],
    "boolean schema": [_tool(parameters={"type": "object", "properties": {"any": True}})],
}

# (route, request fields over the route's good request, the param the 400 must name (None: a success))
CASES: list[tuple[str, dict[str, Any], str | None]] = [
    ("chat", {"temperature": float("nan")}, "temperature"),
    ("chat", {"temperature": float("inf")}, "temperature"),
    ("chat", {"top_p": float("nan")}, "top_p"),
    ("chat", {"temperature": "hot"}, "temperature"),
    ("chat", {"seed": 2**70}, "seed"),
    ("chat", {"seed": -(2**70)}, "seed"),
    ("chat", {"max_tokens": 2**70}, "max_tokens"),
    ("chat", {"max_tokens": 0}, "max_tokens"),
    ("chat", {"max_tokens": 1.5}, "max_tokens"),
    ("chat", {"response_format": "json"}, "response_format"),
    ("chat", {"response_format": {"type": "json_object"}}, "response_format"),
    ("chat", {"response_format": {"type": "text"}}, None),
    ("chat", {"modalities": ["text", "audio"]}, "modalities"),
    ("chat", {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ("chat", {"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ("chat", {"modalities": ["text"]}, None),
    ("chat", {"top_k": 5}, None),
    ("chat", {"top_k": "5"}, "top_k"),
    ("chat", {"repetition_penalty": 1.1}, "repetition_penalty"),  # the CPU engine has no penalty
    ("chat", {"repetition_penalty": 1.0}, None),
    ("chat", {"messages": []}, "messages"),
    ("chat", {"messages": "Hi"}, "messages"),
    ("chat", {"messages": [{"content": "Hi"}]}, "messages[0]"),
    ("chat", {"messages": [{"role": "wizard", "content": "Hi"}]}, "messages[0].role"),
    ("chat", {"messages": [{"role": "user", "content": 5}]}, "messages[0]"),
    ("chat", {"messages": [{"role": "user", "content": [5]}]}, "messages[0]"),
    ("chat", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0]"),
    ("chat", {"messages": [{"role": "user", "content": "\ud800"}]}, "messages[0].content"),
    (
        "chat",
        {"messages": [USER[0], {"role": "assistant", "content": None, "tool_calls": "x"}, USER[0]]},
        "messages[1]",
    ),
    (
        "chat",
        {"messages": [USER[0], {"role": "tool", "content": "1", "tool_call_id": "c9"}]},
        "messages[1].tool_call_id",
    ),
    ("chat", {"tools": "calc"}, "tools"),
    ("chat", {"tools": [{"type": "function"}]}, "tools[0]"),
    ("chat", {"tools": [_tool(description=5)]}, "tools[0].function.description"),
    ("chat", {"tools": [_tool(parameters={"type": "string"})]}, "tools[0].function.parameters"),
    (
        "chat",
        {"tools": [_tool(parameters={"type": "object", "properties": []})]},
        "tools[0].function.parameters.properties",
    ),
    ("chat", {"tool_choice": "required"}, "tool_choice"),
    # fields that change what is generated are honoured or refused, never ignored (the Responses route's rule)
    # reasoning effort: the template's thinking switch (Qwen3's enable_thinking, on as served)
    ("chat", {"reasoning_effort": "low"}, None),
    ("chat", {"reasoning_effort": "none"}, "reasoning_effort"),
    ("chat", {"reasoning_effort": "max"}, "reasoning_effort"),
    ("chat", {"min_p": 0.1}, "min_p"),
    ("chat", {"web_search_options": {}}, "web_search_options"),
    ("chat", {"verbosity": "low"}, "verbosity"),
    ("chat", {"temperture": 0.5}, "temperture"),  # a misspelt field: refused, naming the closest one
    ("chat", {"logit_bias": {}}, None),  # no bias at all: nothing to refuse
    ("chat", {"metadata": {"k": "v"}, "store": False, "user": "u", "service_tier": "auto"}, None),
    ("chat", {"n": 2}, "n"),
    ("chat", {"stream": "yes"}, "stream"),
    ("chat", {"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ("chat", {"stop": ["a", 1]}, "stop"),
    ("chat", {"functions": [{"name": "f", "parameters": {"type": "object"}}], "function_call": "auto"}, None),
    ("chat", {"functions": [{"name": "f"}], "function_call": {"name": "f"}}, "function_call"),
    ("chat", {"functions": [{"description": "no name"}]}, "functions[0].name"),
    *[("chat", {"tools": tools}, None) for tools in ACCEPTED_TOOLS.values()],
    ("responses", {"temperature": float("nan")}, "temperature"),
    ("responses", {"input": []}, "input"),
    ("responses", {"input": [{"type": "image", "url": "x"}]}, "input[0].type"),
    ("responses", {"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content[0]"),
    (
        "responses",
        {"input": [{"type": "function_call_output", "call_id": "c", "output": "1"}]},
        "input[0].call_id",
    ),
    ("responses", {"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ("responses", {"tools": [{"type": "function", "name": "f"}]}, None),
    ("responses", {"text": {"format": {"type": "json_schema"}}}, "text.format"),
    ("responses", {"previous_response_id": "resp_1"}, "previous_response_id"),
    ("responses", {"reasoning": {"effort": "high"}}, None),
    ("responses", {"reasoning": {"effort": "none"}}, "reasoning.effort"),
    ("responses", {"max_output_tokens": -1}, "max_output_tokens"),
    ("responses", {"instructions": 5}, "instructions"),
    ("responses", {"input": "\udc00"}, "input"),
    ("messages", {"temperature": float("nan")}, "temperature"),
    ("messages", {"max_tokens": 2**70}, "max_tokens"),
    ("messages", {"tools": [{"name": "f", "input_schema": {"type": "object"}}]}, None),
    ("messages", {"tools": [{"name": "f", "input_schema": {"type": "object", "properties": {"n": OPTIONAL}}}]}, None),
    ("messages", {"tools": [{"name": "f", "input_schema": "x"}]}, "tools[0].input_schema"),
    ("messages", {"messages": [{"role": "user", "content": "\ud800"}]}, "messages[0].content"),
    ("messages", {"top_k": 3}, None),
]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


@pytest.fixture(scope="module")
def gateway(tiny_qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One ``verl-ext gateway`` serving the tiny model for the module: its base URL and records folder."""
    records = tmp_path_factory.mktemp("hostile-records")
    command = [sys.executable, "-m", "verl_ext.cli.main", "gateway", "--model", str(tiny_qwen3_dir)]
    command += ["--records", str(records), "--response-length", "4096"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    lines: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        if "/sessions/{id}/v1" in line:
            break
    match = re.search(r"(http://[\d.]+:\d+)/sessions/\{id\}/v1", "".join(lines))
    assert match, "".join(lines)
    try:
        yield {"base": match.group(1), "process": process, "records": records}
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()


def _post(base: str, path: str, body: bytes | dict[str, Any], **headers: str) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(
        f"{base}/{path}", content=content, headers={"content-type": "application/json", **headers}, timeout=120
    )


def _error(response: httpx.Response, route: str) -> dict[str, Any]:
    """The error's fields, held to the route's shape: OpenAI's ``{"error": {...}}`` or Anthropic's."""
    assert response.headers["content-type"].startswith("application/json"), response.text
    body = response.json()
    if route == "messages":
        assert body["type"] == "error" and set(body["error"]) >= {"type", "message"}, body
        return {**body["error"], **(body.get("verl_ext") or {})}
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def _good(base: str, session: str, route: str = "chat") -> None:
    path, good = ROUTES[route]
    response = _post(base, f"sessions/{session}/{path}", good)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize(("route", "fields", "param"), CASES, ids=[f"{r}-{json.dumps(f)[:60]}" for r, f, _ in CASES])
def test_a_hostile_request_is_a_4xx_naming_the_field_or_a_success(
    gateway: dict[str, Any], route: str, fields: dict[str, Any], param: str | None
) -> None:
    path, good = ROUTES[route]
    session = f"s{abs(hash((route, json.dumps(fields))))}"
    body = json.dumps({**good, **fields}).encode()  # NaN and Infinity as Python writes them (json.loads reads them)
    response = _post(gateway["base"], f"sessions/{session}/{path}", body)
    if param is None:
        assert response.status_code == 200, response.text
    else:
        assert response.status_code == 400, response.text
        error = _error(response, route)
        assert error["param"] == param, error
        assert param.split(".")[0].split("[")[0] in error["message"] or error["param"] in error["message"], error
    _good(gateway["base"], session, route)  # the session serves a good request after


@pytest.mark.parametrize("route", list(ROUTES))
def test_bad_json_empty_and_deep_bodies_are_400s(gateway: dict[str, Any], route: str) -> None:
    path, _ = ROUTES[route]
    for raw in (b"{", b"", b"\xff\xfe", b"[" * 100_000 + b"]" * 100_000, b'{"seed": 1' + b"0" * 5000 + b"}", b"[1]"):
        response = _post(gateway["base"], f"sessions/bad/{path}", raw)
        assert response.status_code == 400, (raw[:20], response.text)
        _error(response, route)
    _good(gateway["base"], "bad", route)


def test_unknown_paths_wrong_methods_and_oversized_bodies_answer_in_the_api_shape(gateway: dict[str, Any]) -> None:
    base = gateway["base"]
    for path in ("v1/chat/completions", "sessions/x/v1/completions", "sessions/x/v1/embeddings", "nothing"):
        response = _post(base, path, CHAT)
        assert response.status_code == 404, response.text
        assert _error(response, "chat")["code"] == "unknown_url"
    response = httpx.get(f"{base}/sessions/x/v1/chat/completions", timeout=30)
    assert response.status_code == 405 and _error(response, "chat")["code"] == "method_not_allowed"
    response = httpx.get(f"{base}/sessions/x/v1/messages", timeout=30)
    assert response.status_code == 405 and _error(response, "messages")["type"]
    big = b'{"messages": "' + b"x" * (65 * 1024 * 1024) + b'"}'
    response = _post(base, "sessions/x/v1/chat/completions", big)
    assert response.status_code == 413 and _error(response, "chat")["code"] == "request_too_large"
    _good(base, "x")


def test_a_prompt_past_the_context_is_context_length_exceeded_and_the_session_goes_on(
    gateway: dict[str, Any], tiny_qwen3_dir: Path
) -> None:
    context = json.loads((tiny_qwen3_dir / "config.json").read_text())["max_position_embeddings"]
    base, path = gateway["base"], "sessions/long/v1/chat/completions"
    first = _post(base, path, CHAT).json()
    echoed = [*USER, first["choices"][0]["message"]]
    long = {**CHAT, "messages": [*echoed, {"role": "user", "content": "hello " * context}]}
    response = _post(base, path, long)
    assert response.status_code == 400, response.text
    assert _error(response, "chat")["code"] == "context_length_exceeded"
    again = _post(base, path, {**CHAT, "messages": [*echoed, {"role": "user", "content": "Short"}]})
    assert again.status_code == 200, again.text
    assert again.json()["verl_ext"]["fork"] is None  # the failed request left the branch as it was
    ended = httpx.post(f"{base}/sessions/long/end", timeout=60).json()
    assert [b["turns"] for b in ended["branches"]] == [2] and ended["branches"][0]["engine_ok"]
    # a first request past the context leaves no branch behind
    response = _post(base, "sessions/long-first/v1/chat/completions", {**CHAT, "messages": long["messages"][-1:]})
    assert response.status_code == 400 and _error(response, "chat")["code"] == "context_length_exceeded"
    first = _post(base, "sessions/long-first/v1/chat/completions", CHAT).json()
    assert first["verl_ext"]["branch"] == 0 and first["verl_ext"]["fork"] is None


def test_a_max_tokens_past_the_room_left_is_refused_naming_the_field_not_cut_down(
    gateway: dict[str, Any], tiny_qwen3_dir: Path
) -> None:
    """OpenAI's answer to prompt + max_tokens past the context: 400 ``context_length_exceeded`` naming the field and
    the room left, on every route and under each name of the budget (never cut down to fit); a budget that fits is
    served in the same session, which the refusal left as it was."""
    context = json.loads((tiny_qwen3_dir / "config.json").read_text())["max_position_embeddings"]
    base = gateway["base"]
    text = "hello " * (context - 16)  # a prompt that leaves a few tokens of room
    chat = {**CHAT, "messages": [{"role": "user", "content": text}]}
    bodies = {
        "chat": (chat, "max_tokens"),
        "chat-new-name": ({k: v for k, v in chat.items() if k != "max_tokens"}, "max_completion_tokens"),
        "responses": ({**RESPONSES, "input": text}, "max_output_tokens"),
        "messages": ({**MESSAGES, "messages": [{"role": "user", "content": text}]}, "max_tokens"),
    }
    room = None
    for name, (body, field) in bodies.items():
        route = name.split("-")[0]
        response = _post(base, f"sessions/room-{name}/{ROUTES[route][0]}", {**body, field: context})
        assert response.status_code == 400, (name, response.text)
        error = _error(response, route)
        assert error["param"] == field and error["code"] == "context_length_exceeded", (name, error)
        found = re.search(
            rf"'{field}' is {context}, but the prompt is (\d+) tokens .* (\d+) tokens are left", error["message"]
        )
        assert found and context - int(found.group(1)) == int(found.group(2)), error["message"]
        room = room or int(found.group(2))
        assert int(found.group(2)) == room  # the same prompt on every route
        just_over = _post(base, f"sessions/room-{name}/{ROUTES[route][0]}", {**body, field: room + 1})
        assert just_over.status_code == 400 and _error(just_over, route)["param"] == field, just_over.text
    assert room is not None and 0 < room < 16, room
    fits = _post(base, "sessions/room-chat/v1/chat/completions", {**chat, "max_tokens": room})
    assert fits.status_code == 200, fits.text
    assert fits.json()["usage"]["prompt_tokens"] + room == context
    ended = httpx.post(f"{base}/sessions/room-chat/end", timeout=60).json()
    assert [b["turns"] for b in ended["branches"]] == [1] and ended["branches"][0]["engine_ok"]


NOT_AN_IMAGE = "data:image/png;base64," + base64.b64encode(b"not an image at all").decode()
TRUNCATED_PNG = "data:image/png;base64," + base64.b64encode(bytes.fromhex("89504e470d0a1a0a0000000d49484452")).decode()


@pytest.mark.parametrize("url", [NOT_AN_IMAGE, TRUNCATED_PNG], ids=["not an image", "a cut PNG"])
@pytest.mark.parametrize("route", list(ROUTES))
def test_an_undecodable_image_is_a_400_naming_the_bytes_not_a_python_object(
    gateway: dict[str, Any], route: str, url: str
) -> None:
    data = url.split(",", 1)[1]
    part, where = {
        "chat": ({"type": "image_url", "image_url": {"url": url}}, "messages[0].content[0]"),
        "responses": ({"type": "input_image", "image_url": url}, "input[0].content[0]"),
        "messages": ({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}, None),
    }[route]
    message = {"role": "user", "content": [part, {"type": "text", "text": "What is this?"}]}
    path, good = ROUTES[route]
    body = {**good, "input": [message]} if route == "responses" else {**good, "messages": [message]}
    response = _post(gateway["base"], f"sessions/img-{route}-{len(url)}/{path}", body)
    assert response.status_code == 400, response.text
    error = _error(response, route)
    assert where is None or error["param"].startswith(where), error
    text = error["message"]
    assert "cannot be decoded as an image" in text and "send" in text, text
    assert not re.search(r"<[\w.]+ object at 0x[0-9a-f]+>", text), text  # no Python repr
    if url == NOT_AN_IMAGE:
        assert "6e 6f 74 20 61 6e 20 69" in text and "PNG, JPEG, GIF or WebP" in text, text  # b"not an i"
