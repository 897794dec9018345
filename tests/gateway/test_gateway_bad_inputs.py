"""The new user's bad gateway requests (the corpus in tests/bad_inputs.py: ``HTTP``), sent to one in-process app on
the tiny Qwen3 model: each answered with the entry's status and a one-line message in the route's error shape
(OpenAI's ``{"error": {"message", ...}}``, Anthropic's ``{"type": "error", "error": {...}}`` on the Messages route)
naming the problem and the fix, with no traceback and no Python repr."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from bad_inputs import FIX_WORDS, HTTP, NOT_FOR_USERS, Http
from fastapi.testclient import TestClient

ROUTES = {
    "chat": "/sessions/{s}/v1/chat/completions",
    "responses": "/sessions/{s}/v1/responses",
    "messages": "/sessions/{s}/v1/messages",
    "models": "/sessions/{s}/v1/models",
    "open": "/sessions/{s}/open",
    "end": "/sessions/{s}/end",
}


@pytest.fixture(scope="module")
def client(gateway_parts: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """One app for the whole corpus; session ``done`` has served a turn and ended."""
    from verl_ext.gateway.server import create_app
    from verl_ext.gateway.service import Gateway
    from verl_ext.runtime import RolloutRuntime
    from verl_ext.telemetry.records import RecordWriter, header_record

    gateway_parts["script"].turns = ["Hi.<|im_end|>"]
    runtime = RolloutRuntime.build(gateway_parts["renderer"])
    records = tmp_path_factory.mktemp("bad-input-records")
    runtime = runtime.with_writer(RecordWriter(Path(records), header_record(runtime.profile), prefix="gateway"))
    gateway = Gateway(gateway_parts["engine"], runtime, gateway_parts["reader"], markers=gateway_parts["markers"])
    with TestClient(create_app(gateway, "tiny-qwen3"), raise_server_exceptions=False) as http:
        served = http.post(ROUTES["chat"].format(s="done"), json={"messages": [{"role": "user", "content": "Hi"}]})
        assert served.status_code == 200, served.text
        assert http.post(ROUTES["end"].format(s="done")).status_code == 200
        yield http
    assert gateway.counters["turns"] == 1  # no entry of the corpus reached the engine


def _message(case: Http, body: Any) -> str:
    """The one message of the answer, read in the route's shape."""
    if case.status == 200:
        return body["note"]
    if case.path == "messages" or case.path.endswith("/v1/messages"):
        assert body["type"] == "error" and set(body) == {"type", "error", "verl_ext"}, body
        assert body["error"]["type"] == {400: "invalid_request_error", 404: "not_found_error"}.get(
            case.status, body["error"]["type"]
        ), body
        return body["error"]["message"]
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]["message"]


@pytest.mark.parametrize("case", HTTP, ids=[f"{c.path} {str(c.raw or c.body)[:60]}" for c in HTTP])
def test_a_bad_request_gets_one_clear_line(case: Http, client: TestClient) -> None:
    path = ROUTES.get(case.path, case.path).format(s=case.session)
    if case.raw is not None:
        answer = client.request(case.method, path, content=case.raw, headers={"content-type": "application/json"})
    elif case.body is None:
        answer = client.request(case.method, path)
    else:
        answer = client.request(case.method, path, json=case.body)
    assert answer.status_code == case.status, (case, answer.text)
    message = _message(case, answer.json())
    assert len(message.strip().splitlines()) == 1 and not NOT_FOR_USERS.search(message), (case, message)
    for words in case.says:
        assert words in message, (case, words, message)
    assert FIX_WORDS.search(message), ("no fix named", case, message)
