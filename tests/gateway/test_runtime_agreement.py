"""The gateway and the agent loops conclude a rollout through one runtime (verl_ext.runtime), and agree on it.

Before, the gateway ran the check when ``check.mode`` was ``off`` and a failed record write failed its session,
while ``verl_ext_tool_agent`` skipped the check and counted the failure. Each test here runs a gateway session and
hands the same rollout to the loop's end (``RolloutRuntime.conclude``): the two verdicts and counters are equal."""

from __future__ import annotations

import asyncio
from collections import Counter
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


def test_check_off_means_no_check_in_the_gateway_as_in_the_loop(gateway_parts: Any) -> None:
    runtime = RolloutRuntime.build(gateway_parts["renderer"], policy=CheckPolicy(mode="off"))
    runtime.checker.check_rollout = None  # type: ignore[method-assign]  # calling the check would raise here
    gateway = session(gateway_parts, runtime)
    (branch,) = gateway.end("s")
    assert branch.result == checked_off(branch.rollout) and not branch.result.template_view
    counters: Counter[str] = Counter()
    assert runtime.conclude(branch.rollout, counters) == branch.result  # the loop's end: the same verdict
    assert not counters


def test_a_failed_record_write_is_counted_in_the_gateway_as_in_the_loop(gateway_parts: Any, tmp_path: Path) -> None:
    writer = RecordWriter(tmp_path, header_record(gateway_parts["profile"]), prefix="gateway")
    writer.path.mkdir()  # the record file's name is taken by a folder: every write fails
    runtime = RolloutRuntime.build(gateway_parts["renderer"]).with_writer(writer)
    gateway = session(gateway_parts, runtime)
    (branch,) = gateway.end("s")  # before, the write's OSError came out of here
    assert branch.record_failed and branch.result.ok
    assert gateway.counters["records/write_failures"] == 1
    counters: Counter[str] = Counter()
    result = runtime.conclude(branch.rollout, counters)  # the loop's end on the same rollout
    assert result.ok and result.findings == branch.result.findings
    assert counters["records/write_failures"] == 1


def test_a_written_record_is_the_same_from_the_gateway_and_the_loop(gateway_parts: Any, tmp_path: Path) -> None:
    from verl_ext.telemetry.records import read_records

    writer = RecordWriter(tmp_path / "gateway", header_record(gateway_parts["profile"]), prefix="gateway")
    gateway = session(gateway_parts, RolloutRuntime.build(gateway_parts["renderer"]).with_writer(writer))
    (branch,) = gateway.end("s")
    loop = RolloutRuntime.build(gateway_parts["renderer"], records_dir=tmp_path / "loop")
    counters: Counter[str] = Counter()
    loop.conclude(branch.rollout, counters)
    assert not branch.record_failed and not counters
    _, (from_gateway,) = read_records([writer.path])
    _, (from_loop,) = read_records([loop.writer.path])  # type: ignore[union-attr]
    timed = {"seconds"}  # how long each check took: the one field two runs of the same check differ in
    assert {k: v for k, v in from_gateway.check.to_json().items() if k not in timed} == {
        k: v for k, v in from_loop.check.to_json().items() if k not in timed
    }
    assert from_gateway.engine_calls == from_loop.engine_calls and from_gateway.extra == from_loop.extra
    assert from_gateway.input_ids == from_loop.input_ids and from_gateway.loss_mask == from_loop.loss_mask
