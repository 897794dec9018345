"""How a gateway session's end concludes its branches through the runtime (verl_ext.runtime): ``check.mode`` off
runs no check, and a failed record write is counted, not raised.

Before, the gateway ran the check when ``check.mode`` was ``off`` and a failed record write failed its session. That the
four callers of the runtime agree on a rollout is tests/runtime/test_four_callers.py; this file once compared
``gateway.end`` with ``RolloutRuntime.conclude``, which it calls (a check that cannot fail): removed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from gateway_fixtures import CALL, TOOLS

from verl_ext.check import CheckPolicy
from verl_ext.gateway.request import parse_chat_request
from verl_ext.gateway.service import Gateway, GatewayConfig
from verl_ext.runtime import RolloutRuntime, checked_off
from verl_ext.telemetry.records import RecordWriter, header_record

ANSWER = "The answer is 42.<|im_end|>"


def session(parts: dict[str, Any], runtime: RolloutRuntime) -> Gateway:
    """A gateway on ``runtime`` that served one session of two turns (a tool call, its answer), not yet ended."""
    parts["script"].turns = [CALL % "6*7", ANSWER]
    gateway = Gateway(parts["engine"], runtime, parts["reader"], GatewayConfig(), markers=parts["markers"])
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 6*7?"}]
    first = asyncio.run(gateway.complete("s", parse_chat_request({"messages": messages, "tools": TOOLS})))
    call_id = first.message["tool_calls"][0]["id"]
    messages += [first.message, {"role": "tool", "tool_call_id": call_id, "content": "42"}]
    asyncio.run(gateway.complete("s", parse_chat_request({"messages": messages, "tools": TOOLS})))
    return gateway


def test_check_off_means_no_check_in_the_gateway(gateway_parts: Any) -> None:
    runtime = RolloutRuntime.build(gateway_parts["renderer"], policy=CheckPolicy(mode="off"))
    runtime.checker.check_rollout = None  # type: ignore[method-assign]  # calling the check would raise here
    gateway = session(gateway_parts, runtime)
    (branch,) = gateway.end("s")
    assert branch.result == checked_off(branch.rollout) and not branch.result.template_view


def test_a_failed_record_write_is_counted_not_raised(gateway_parts: Any, tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path, header_record(gateway_parts["profile"]), prefix="gateway")
    writer.path.mkdir()  # the record file's name is taken by a folder: every write fails
    runtime = RolloutRuntime.build(gateway_parts["renderer"]).with_writer(writer)
    gateway = session(gateway_parts, runtime)
    (branch,) = gateway.end("s")  # before, the write's OSError came out of here
    assert branch.record_failed and branch.result.ok
    assert gateway.counters["records/write_failures"] == 1
