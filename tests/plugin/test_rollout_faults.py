"""Faults during a rollout, in verl's agent loop with verl_ext's loop and the CPU engine: an aborted or cut turn is
continued as one turn, a turn that cannot be completed and a dead rollout server end the rollout with a clear error,
a reward function that raises stops the step with its error. Nothing half-done trains, nothing hangs.

(A tool hanging past its timeout: test_agent_loop.py::test_tool_exceptions_and_timeouts_become_tool_messages.)
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
from loop_harness import run_loop

from verl_ext.engines.sglang_output import ENGINE_FIELD
from verl_ext.plugin import engine_turn, metrics_sink
from verl_ext.plugin.engine_turn import RolloutInterrupted

pytestmark = pytest.mark.xdist_group("ray")  # the Ray group: tests/conftest.py

PROMPT = [{"role": "user", "content": "What is 12 * 7? Use the calculator."}]


class InterruptingServer:
    """verl's server-manager interface over the CPU engine; the first ``interruptions`` calls return only the first
    ``keep`` ids the engine generated, marked as SGLang marks them: ``abort`` (a pause for a weight sync), or
    incomplete by verl_ext's SGLang server's logprob/id check."""

    def __init__(self, inner: Any, keep: int, interruptions: int, how: str) -> None:
        self.inner, self.keep, self.left, self.how = inner, keep, interruptions, how
        self.calls: list[dict[str, Any]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any):
        self.calls.append({"prompt_ids": list(prompt_ids), "max_tokens": sampling_params["max_tokens"]})
        interrupt = self.left > 0 and sampling_params["max_tokens"] > self.keep
        if interrupt:  # the engine stops early: only the ids it had when the abort came
            sampling_params = {**sampling_params, "max_tokens": self.keep}
        out = await self.inner.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kw)
        if interrupt and len(out.token_ids) == self.keep:
            self.left -= 1
            if self.how == "abort":
                out.stop_reason = "abort"
            else:
                out.extra_fields = {**out.extra_fields, ENGINE_FIELD: {"complete": False, "ids_match_logprobs": False}}
        self.calls[-1]["output_ids"] = list(out.token_ids)
        return out


@pytest.mark.parametrize("how", ["abort", "id_check_cut"])
def test_an_interrupted_turn_is_continued_as_one_turn(make_loop, how: str) -> None:
    metrics_sink.drain()
    loop, server = make_loop(response_length=12)
    interrupting = InterruptingServer(server, keep=5, interruptions=1, how=how)
    loop.server_manager = interrupting
    out = run_loop(loop, PROMPT)
    first, second = interrupting.calls[0], interrupting.calls[1]
    assert second["prompt_ids"] == first["prompt_ids"] + first["output_ids"]  # continued from the partial ids
    assert second["max_tokens"] == first["max_tokens"] - 5
    n = len(first["output_ids"]) + len(second["output_ids"])
    assert out.response_ids[:n] == first["output_ids"] + second["output_ids"]
    assert out.response_mask[:n] == [1] * n  # both parts sampled, logprobs kept
    assert len(out.response_logprobs) == len(out.response_ids)
    assert out.extra_fields["verl_ext_check"]["engine_ok"]
    m = metrics_sink.drain()
    assert m["tito/engine/continued_turns"] == 1 and m["tito/engine_view_failures"] == 0


def test_a_turn_aborted_at_every_call_is_continued_while_each_call_adds_ids(make_loop) -> None:
    """Under verl's async trainers a long turn meets one abort per weight update: it is continued as long as the
    engine makes progress (verl's client continues it too), however many calls that takes."""
    loop, server = make_loop(response_length=16)
    loop.server_manager = InterruptingServer(server, keep=2, interruptions=100, how="abort")
    metrics_sink.drain()
    out = run_loop(loop, PROMPT)
    calls = loop.server_manager.calls
    assert len(calls) > 5  # more than the four continuations a turn used to be allowed
    assert all(len(c["output_ids"]) >= 1 for c in calls)
    assert out.extra_fields["verl_ext_check"]["engine_ok"]


class _Rejecting:
    """A replica that answers every request aborted with no ids (verl's reject_request while it trains)."""

    def __init__(self) -> None:
        self.calls = 0

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any):
        from verl.workers.rollout.replica import TokenOutput

        self.calls += 1
        return TokenOutput(token_ids=[], log_probs=[], stop_reason="aborted", extra_fields={})


def test_a_turn_that_gets_no_ids_ends_the_rollout_with_an_error(make_loop, monkeypatch) -> None:
    monkeypatch.setattr(engine_turn, "STALL_TIMEOUT_S", 0.3)
    loop, _ = make_loop(response_length=16)
    loop.server_manager = _Rejecting()
    metrics_sink.drain()
    with pytest.raises(RolloutInterrupted, match="no new ids"):
        run_loop(loop, PROMPT)
    assert 2 <= loop.server_manager.calls <= 8  # retried with a growing wait, not spun
    # the dropped rollout's counters still reach verl's logger
    assert metrics_sink.drain()["tito/engine/interrupted_turns"] == 1


class _Stuck:
    """A rollout server that never answers in time: the test kills it mid-request."""

    def ready(self) -> bool:
        return True

    async def generate(self, request_id: str, prompt_ids: list[int], sampling_params: dict[str, Any]) -> Any:
        await asyncio.sleep(600)


class RayServerManager:
    """verl's client path: the request goes to a rollout server Ray actor."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any):
        return await self.actor.generate.remote(request_id, prompt_ids, sampling_params)


@pytest.fixture
def ray_local(monkeypatch: pytest.MonkeyPatch):
    import ray

    # Ray's workers import the test's actor class by its module (this file): put its folder on their path, which
    # they inherit from the cluster ray.init starts (a cluster an earlier test started and shut down left none)
    here = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p))
    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.timeout(180)
def test_rollout_server_actor_killed_mid_rollout_is_a_clear_error(make_loop, ray_local) -> None:
    loop, _ = make_loop(response_length=8)
    actor = ray_local.remote(num_cpus=0)(_Stuck).remote()
    assert ray_local.get(actor.ready.remote(), timeout=120)  # started (a loaded host starts actors slowly)
    loop.server_manager = RayServerManager(actor)

    async def kill_soon() -> None:
        await asyncio.sleep(3)
        ray_local.kill(actor, no_restart=True)

    async def rollout() -> Any:
        killer = asyncio.ensure_future(kill_soon())
        try:
            return await loop.run({"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}, raw_prompt=PROMPT)
        finally:
            await killer

    metrics_sink.drain()
    with pytest.raises(RolloutInterrupted, match="rollout server failed"):
        loop.loop.run_until_complete(rollout())
    assert metrics_sink.drain()["tito/engine/server_failures"] == 1


def test_a_reward_function_that_raises_stops_the_step_with_its_error(tiny_qwen3_dir) -> None:
    """verl's reward loop (naive manager, as the demo uses) passes the error on: no silent reward of 0."""
    import numpy as np
    import torch
    from transformers import AutoTokenizer
    from verl import DataProto
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager

    def broken_reward(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
        raise ValueError("reward function bug: ground truth missing")

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))
    ids = torch.tensor([[1, 2, 3, 4]])
    data = DataProto.from_dict(
        tensors={
            "prompts": ids[:, :2],
            "responses": ids[:, 2:],
            "attention_mask": torch.ones_like(ids),
        },
        non_tensors={
            "data_source": np.array(["calc"], dtype=object),
            "reward_model": np.array([{"ground_truth": "84"}], dtype=object),
            "extra_info": np.array([{}], dtype=object),
        },
    )

    async def score() -> Any:  # the manager binds the running event loop, as verl's reward worker builds it
        manager = NaiveRewardManager(config=None, tokenizer=tokenizer, compute_score=broken_reward)
        return await manager.run_single(data)

    with pytest.raises(ValueError, match="reward function bug"):
        asyncio.run(score())
