"""Ending a gateway session twice concludes it once: its branches are checked, recorded and counted on the first end,
and every later end (the harness's own ``/end`` and then verl_ext_gateway_agent's, a shutdown after either, an end
after the gateway ended the session itself) returns nothing and writes nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_fixtures import CALL, TOOLS

from verl_ext.gateway.errors import GatewayError
from verl_ext.gateway.request import parse_chat_request
from verl_ext.gateway.server import ServerThread, create_app
from verl_ext.telemetry.records import read_records

ANSWER = "<think>\nThe tool said %s.\n</think>\n\nThe answer is %s.<|im_end|>"
# what a second conclusion would count again
CONCLUSION_COUNTS = ("sessions_served", "branches_recorded", "engine_view_failures")


def ask(gateway: Any, session: str, messages: list[dict[str, Any]]) -> Any:
    request = parse_chat_request({"messages": messages, "tools": TOOLS, "max_tokens": 64})
    return asyncio.run(gateway.complete(session, request))


def forked_session(gateway: Any, session: str) -> None:
    """A session of two branches: a tool call answered, then the same call answered otherwise (a fork)."""
    messages = [{"role": "user", "content": "What is 6*7?"}]
    done = ask(gateway, session, messages)
    call_id = done.message["tool_calls"][0]["id"]
    for result in ("42", "41"):
        ask(gateway, session, [*messages, done.message, {"role": "tool", "tool_call_id": call_id, "content": result}])


def recorded(tmp_path: Path) -> int:
    _, rollouts = read_records(sorted((tmp_path / "records").glob("*.jsonl")))
    return len(rollouts)


def counts(gateway: Any) -> dict[str, int]:
    return {name: gateway.counters[name] for name in CONCLUSION_COUNTS}


@pytest.mark.parametrize("again", ["end", "end_with_training", "end_all"])
def test_a_second_end_records_and_counts_nothing(make_gateway: Any, tmp_path: Path, again: str) -> None:
    gateway = make_gateway([CALL % "6*7", ANSWER % (42, 42), ANSWER % (41, 41)])
    forked_session(gateway, "s")
    first = gateway.end("s")
    assert [r.branch for r in first] == [0, 1]
    after_first = counts(gateway)
    assert after_first["sessions_served"] == 1 and after_first["branches_recorded"] == 2
    assert recorded(tmp_path) == 2
    if again == "end":
        second = gateway.end("s")
    elif again == "end_with_training":  # the agent loop's end, with its training plan
        second = gateway.end("s", "the harness finished", training={})
    else:
        second = gateway.end_all()
    assert second == []
    assert counts(gateway) == after_first
    assert recorded(tmp_path) == 2
    assert gateway.ended["s"] == "ended by the client"  # the first end's reason stands


def test_the_harness_ends_over_http_then_the_loop_ends_it(make_gateway: Any, tmp_path: Path) -> None:
    gateway = make_gateway([CALL % "6*7", ANSWER % (42, 42), ANSWER % (41, 41)])
    forked_session(gateway, "h")
    server = ServerThread(create_app(gateway, "tiny-qwen3")).start()
    try:
        first = httpx.post(f"{server.url}/sessions/h/end", timeout=60)
        first.raise_for_status()
        assert len(first.json()["branches"]) == 2
        after_first = counts(gateway)
        again = httpx.post(f"{server.url}/sessions/h/end", timeout=60)  # a harness that ends twice
        again.raise_for_status()
        assert again.json()["branches"] == []
    finally:
        server.stop()
    # then verl_ext_gateway_agent ends the row's session with its plan
    assert gateway.end("h", "the harness finished", training={}) == []
    assert counts(gateway) == after_first
    assert recorded(tmp_path) == 2


def test_concurrent_ends_conclude_once(make_gateway: Any, tmp_path: Path) -> None:
    """The harness's ``/end`` and the loop's end racing for the session's lock: one of them concludes it."""
    gateway = make_gateway([CALL % "6*7", ANSWER % (42, 42), ANSWER % (41, 41)])
    forked_session(gateway, "c")
    session = gateway.sessions["c"]

    async def end_under_lock(why: str) -> list[Any]:
        async with session.lock:
            await asyncio.sleep(0)
            return gateway.end("c", why)

    async def both() -> list[list[Any]]:
        return list(await asyncio.gather(end_under_lock("ended by the client"), end_under_lock("the harness finished")))

    results = asyncio.run(both())
    assert sorted(len(r) for r in results) == [0, 2]
    assert counts(gateway)["branches_recorded"] == 2 and counts(gateway)["sessions_served"] == 1
    assert recorded(tmp_path) == 2


def test_an_end_after_the_gateway_ended_the_session_itself(make_gateway: Any, tmp_path: Path) -> None:
    """The branch cap ends and records the session in the refused request; the client's end then adds nothing."""
    gateway = make_gateway([CALL % "1"], max_branches=2)
    messages = [{"role": "user", "content": "What is 6*7?"}]
    ask(gateway, "b", messages)
    ask(gateway, "b", messages)  # a retry: the second branch
    with pytest.raises(GatewayError) as capped:
        ask(gateway, "b", messages)
    assert capped.value.code == "too_many_branches"
    after_cap = counts(gateway)
    assert after_cap["branches_recorded"] == 2 and recorded(tmp_path) == 2
    assert gateway.end("b") == []
    assert counts(gateway) == after_cap
    assert recorded(tmp_path) == 2
