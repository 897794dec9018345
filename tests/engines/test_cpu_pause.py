"""Partial rollouts on the CPU engine (cpu_pause.py) with the real tiny Qwen3 model: verl's abort stops a request
between two ids and returns what it has, aborted, with its logprobs; requests wait out the pause; the engine report
stamps the version each request was generated on; the TEST ONLY ``abort_after`` fault parks one request per version
until the abort; the truth log says which version generated which ids."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from verl_ext.core.errors import OptionsError
from verl_ext.core.version_spans import DISPATCH_VERSION_FIELD, STOP_VERSION_FIELD
from verl_ext.engines.cpu import CPUGenerationServer
from verl_ext.engines.cpu_faults import parse_faults
from verl_ext.engines.cpu_pause import ParkPlan, ids_digest, read_truth
from verl_ext.engines.sglang_output import ENGINE_FIELD

PARAMS = {"temperature": 1.0, "logprobs": True, "ignore_eos": True, "seed": 7}


@pytest.fixture(scope="module")
def prompt(tiny_qwen3_dir: Path) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))
    messages = [{"role": "user", "content": "What is 12 * 7? Use the calculator tool."}]
    return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def server(model_dir: Path, **kw: Any) -> CPUGenerationServer:
    return CPUGenerationServer(str(model_dir), prompt_length=512, response_length=256, seed=0, **kw)


async def until(predicate: Any, timeout_s: float = 60.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("timed out")


def test_an_abort_stops_the_request_between_ids_and_returns_them_with_their_logprobs(tiny_qwen3_dir, prompt):
    srv = server(tiny_qwen3_dir)

    async def scenario() -> tuple[Any, Any]:
        whole = await srv.generate(prompt, {**PARAMS, "max_tokens": 200}, "whole")
        task = asyncio.create_task(srv.generate(prompt, {**PARAMS, "max_tokens": 200}, "cut"))
        await until(lambda: srv._in_flight)
        await asyncio.sleep(0.05)  # a few ids in
        answer = await srv.abort_all_requests()
        assert answer["aborted_count"] == 1 and answer["request_ids"] == ["cut"]
        cut = await task
        srv.gate.resume()
        return whole, cut

    whole, cut = asyncio.run(scenario())
    assert cut.stop_reason == "aborted" and 0 < len(cut.token_ids) < 200
    # the same seed: the cut request's ids and logprobs are the uninterrupted request's first ids and logprobs
    n = len(cut.token_ids)
    assert cut.token_ids == whole.token_ids[:n] and cut.log_probs == whole.log_probs[:n]
    assert cut.extra_fields[ENGINE_FIELD]["complete"] is False
    assert whole.extra_fields[ENGINE_FIELD]["complete"] is True


def test_requests_wait_out_the_pause_and_are_generated_on_the_new_weights(tiny_qwen3_dir, prompt, tmp_path):
    truth = tmp_path / "truth.jsonl"
    faults = [{"kind": "abort_after", "tokens": 3}]
    srv = server(tiny_qwen3_dir, faults=faults, truth_log=str(truth))

    async def scenario() -> list[Any]:
        await srv.set_global_steps(0)
        parked = asyncio.create_task(srv.generate(prompt, {**PARAMS, "max_tokens": 20}, "a"))
        await until(lambda: srv.fault_hits.get("abort_after"))  # parked after 3 ids, the model released
        other = await srv.generate(prompt, {**PARAMS, "max_tokens": 5}, "b")  # not parked: one per version
        await srv.abort_all_requests()
        first = await parked
        resumed = asyncio.create_task(srv.generate([*prompt, *first.token_ids], {**PARAMS, "max_tokens": 17}, "a2"))
        await asyncio.sleep(0.2)
        assert not resumed.done()  # parked behind the closed gate
        await srv.set_global_steps(1)  # the weight update
        await srv.resume_generation()
        return [other, first, await resumed]

    other, first, resumed = asyncio.run(scenario())
    assert len(other.token_ids) == 5 and other.stop_reason == "length"
    assert first.stop_reason == "aborted" and len(first.token_ids) == 3 and len(first.log_probs) == 3
    assert resumed.stop_reason == "length" and len(resumed.token_ids) == 17  # a resume is never parked again
    report = first.extra_fields[ENGINE_FIELD]
    assert report[DISPATCH_VERSION_FIELD] == 0 and report[STOP_VERSION_FIELD] == 0
    assert resumed.extra_fields[ENGINE_FIELD][DISPATCH_VERSION_FIELD] == 1  # generated after the update
    assert srv.fault_hits == {"abort_after": 1}
    lines = read_truth(truth)
    assert lines[ids_digest([*prompt, *first.token_ids])]["version"] == 0
    assert lines[ids_digest([*prompt, *first.token_ids, *resumed.token_ids])]["version"] == 1


def test_a_rejecting_gate_answers_aborted_with_no_ids(tiny_qwen3_dir, prompt):
    srv = server(tiny_qwen3_dir)

    async def scenario() -> Any:
        await srv.abort_all_requests(reject_request=True)
        out = await srv.generate(prompt, {**PARAMS, "max_tokens": 5}, "x")
        await srv.resume_generation()
        return out, await srv.generate(prompt, {**PARAMS, "max_tokens": 5}, "y")

    rejected, served = asyncio.run(scenario())
    assert rejected.stop_reason == "aborted" and rejected.token_ids == []
    assert len(served.token_ids) == 5


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([{"kind": "abort_after"}], "missing keys ['tokens']"),
        ([{"kind": "abort_after", "tokens": 0}], "tokens must be an integer >= 1"),
        ([{"kind": "abort_after", "tokens": 2, "wait_s": -1}], "wait_s must be a positive number"),
        ([{"kind": "abort_after", "tokens": 2, "versions": [1]}], "unknown keys ['versions']"),
    ],
)
def test_bad_abort_after_faults_are_refused_with_the_fix(raw: Any, message: str) -> None:
    with pytest.raises(OptionsError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_faults(raw)


def test_a_parked_request_wakes_on_an_abort_even_when_the_resume_follows_at_once(tiny_qwen3_dir, prompt):
    """verl's abort and resume can both come before the parked request is scheduled again: it still returns, at
    once, rather than waiting out ``wait_s`` (it did, with an event the resume cleared)."""
    srv = server(tiny_qwen3_dir, faults=[{"kind": "abort_after", "tokens": 2, "wait_s": 60}])

    async def scenario() -> tuple[Any, float]:
        await srv.set_global_steps(0)
        parked = asyncio.create_task(srv.generate(prompt, {**PARAMS, "max_tokens": 8}, "a"))
        await until(lambda: srv.fault_hits.get("abort_after"))
        srv.gate.abort()
        srv.gate.resume()  # no await in between: the parked request has not run since it parked
        started = asyncio.get_running_loop().time()
        out = await parked
        return out, asyncio.get_running_loop().time() - started

    out, waited = asyncio.run(scenario())
    assert out.stop_reason == "aborted" and len(out.token_ids) == 2
    assert "abort_after_timeout" not in srv.fault_hits and waited < 30


def test_a_parked_request_wakes_on_an_abort_and_resume_that_come_while_its_thread_returns(
    tiny_qwen3_dir, prompt, monkeypatch
):
    """verl's abort and resume can both run between the generation thread's return and the request's next step
    (the loop runs them first): the abort came after the request was dispatched, so it still wakes it at once rather
    than leaving it parked for ``wait_s`` (the abort count was read after that window, and the wait then waited for
    a later abort)."""
    import verl_ext.engines.cpu as cpu

    srv = server(tiny_qwen3_dir, faults=[{"kind": "abort_after", "tokens": 2, "wait_s": 20}])
    real, loops = cpu.generate_tokens, []

    def generate_then_abort_and_resume(*args: Any, **kwargs: Any) -> Any:
        out = real(*args, **kwargs)
        loops[0].call_soon_threadsafe(lambda: (srv.gate.abort(), srv.gate.resume()))  # before the request resumes
        return out

    monkeypatch.setattr(cpu, "generate_tokens", generate_then_abort_and_resume)

    async def scenario() -> tuple[Any, float]:
        loop = asyncio.get_running_loop()
        loops.append(loop)
        await srv.set_global_steps(0)
        started = loop.time()
        out = await srv.generate(prompt, {**PARAMS, "max_tokens": 8}, "a")
        return out, loop.time() - started

    out, waited = asyncio.run(scenario())
    assert out.stop_reason == "aborted" and len(out.token_ids) == 2
    assert "abort_after_timeout" not in srv.fault_hits and waited < 15


def test_a_version_whose_parked_request_ended_early_parks_the_next_one() -> None:
    """One request per version is parked; if the one chosen stops on a stop id before its park point, the version
    has resumed nothing yet, so the next request of that version is parked instead (else a step may see no resume)."""
    plan = ParkPlan(tokens=4, wait_s=1.0)
    assert plan.park_at([1, 2, 3], 0, 7) == 4
    assert plan.park_at([1, 2, 4], 0, 7) is None  # one per version
    plan.finished_unparked(7)
    assert plan.park_at([1, 2, 5], 0, 7) == 4
    assert plan.park_at([1, 2, 6], 0, 8) == 4  # another version parks its own
