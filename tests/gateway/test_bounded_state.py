"""The gateway holds what is open, not what it served: an ended session is released once recorded; a late call on it
is a 409 from a bounded set of ended ids; an idle session is ended, recorded and counted; ending twice concludes once.
"""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from typing import Any

import pytest
from gateway_fixtures import TOOLS

from verl_ext.gateway.errors import GatewayError
from verl_ext.gateway.request import parse_chat_request
from verl_ext.telemetry.records import read_records

SESSIONS = 2000
ANSWER = "Hello.<|im_end|>"


def ask(gateway: Any, session: str, text: str = "Hi", tools: bool = True) -> Any:
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 8}
    request = parse_chat_request({**body, "tools": TOOLS} if tools else body)
    return asyncio.run(gateway.complete(session, request))


@pytest.fixture
def one_thread() -> Any:
    """torch on one thread for a test that makes thousands of tiny forward passes: two threads per pytest worker on
    two cores shared with the other worker spin against each other (measured 20x slower per pass under load)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_two_thousand_ended_sessions_leave_only_their_ids(make_gateway: Any, tmp_path: Any, one_thread: Any) -> None:
    """2,000 sessions served and ended: no session, branch or trajectory object outlives its end (weak references
    die), the open map is empty, and the ended ids kept are the last ``ended_ids``; every session was recorded.
    (Their 2,000 replays are left out: they prove nothing the other gateway tests do not.)"""
    gateway = make_gateway([ANSWER], replay=False, ended_ids=500)
    alive: list[weakref.ref[Any]] = []
    for k in range(SESSIONS):
        ask(gateway, f"s{k}", tools=False)
        session = gateway.sessions[f"s{k}"]
        alive += [weakref.ref(session), weakref.ref(session.branches[0]), weakref.ref(session.branches[0].trajectory)]
        (result,) = gateway.end(f"s{k}")
        assert result.result.engine_ok, result.result.engine_failures
        del session, result
    gc.collect()
    assert not gateway.sessions and not gateway._active
    assert sum(ref() is not None for ref in alive) == 0, "an ended session's state is still held"
    assert len(gateway.ended) == 500 and f"s{SESSIONS - 1}" in gateway.ended and "s0" not in gateway.ended
    c = gateway.counters
    counted = (c["sessions"], c["sessions_served"], c["branches_recorded"], c["engine_view_failures"])
    assert counted == (SESSIONS, SESSIONS, SESSIONS, 0), counted
    _, rollouts = read_records(sorted((tmp_path / "records").glob("*.jsonl")))
    assert len(rollouts) == SESSIONS


def test_a_late_call_on_an_ended_session_is_a_409_and_opens_nothing(make_gateway: Any) -> None:
    gateway = make_gateway([ANSWER, ANSWER])
    ask(gateway, "s")
    gateway.end("s", "the harness finished")
    for late in (lambda: ask(gateway, "s"), lambda: gateway.open("s")):
        with pytest.raises(GatewayError) as refused:
            late()
        assert refused.value.status == 409 and "the harness finished" in str(refused.value), refused.value
    assert "s" not in gateway.sessions and gateway.counters["sessions"] == 1


def test_ending_twice_concludes_once(make_gateway: Any, tmp_path: Any) -> None:
    """A harness that ends its own session, and the loop ending it again: one record, one count."""
    gateway = make_gateway([ANSWER])
    ask(gateway, "s")
    assert len(gateway.end("s")) == 1
    assert gateway.end("s") == [] and gateway.end("s", "again") == []
    _, rollouts = read_records(sorted((tmp_path / "records").glob("*.jsonl")))
    assert len(rollouts) == 1 and gateway.counters["branches_recorded"] == 1


def test_ending_an_unknown_session_says_what_the_gateway_remembers(make_gateway: Any) -> None:
    gateway = make_gateway([], ended_ids=3)
    with pytest.raises(GatewayError) as unknown:
        gateway.end("never")
    text = str(unknown.value)
    assert unknown.value.status == 404 and "open it first" not in text, text
    assert "no session of this id was opened, or it ended before the last 3 ended sessions" in text, text


def test_an_idle_session_is_ended_recorded_and_counted(make_gateway: Any, tmp_path: Any) -> None:
    gateway = make_gateway([ANSWER, ANSWER], idle_timeout_s=600)
    ask(gateway, "idle")
    ask(gateway, "busy")
    assert gateway.expire_idle(now=time.monotonic() + 60) == 0  # within the timeout: nothing ends
    gateway._active["busy"] = time.monotonic() + 10_000  # active since (as if it had a request later)
    assert gateway.expire_idle(now=time.monotonic() + 601) == 1
    assert "idle" not in gateway.sessions and "busy" in gateway.sessions
    assert gateway.counters["sessions_expired"] == 1
    with pytest.raises(GatewayError) as late:
        ask(gateway, "idle")
    assert late.value.status == 409 and "idle for more than 600 s" in str(late.value), late.value
    _, rollouts = read_records(sorted((tmp_path / "records").glob("*.jsonl")))
    assert [r.extra["gateway"]["session"] for r in rollouts] == ["idle"]  # recorded, never discarded
    gateway.end_all()


def test_a_turn_in_flight_is_not_idle(make_gateway: Any) -> None:
    gateway = make_gateway([ANSWER], idle_timeout_s=1)
    ask(gateway, "s")

    async def expire_while_locked() -> int:
        async with gateway.sessions["s"].lock:
            return gateway.expire_idle(now=time.monotonic() + 5)

    assert asyncio.run(expire_while_locked()) == 0 and "s" in gateway.sessions
    assert gateway.expire_idle(now=time.monotonic() + 5) == 1
