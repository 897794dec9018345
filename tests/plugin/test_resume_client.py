"""verl's resume client against verl_ext's, over the CPU engine in process (tests/plugin/async_harness.py), a weight
update landing after exactly 3 sampled ids of a request (the engine's TEST ONLY ``abort_after`` fault):

- verl 0.9.1's ``FullyAsyncLLMServerClient`` (as installed) joins the attempts and drops what verl_ext needs: the
  engine's report (``verl_ext_engine``: the version each attempt was sent on), the split point, the per-attempt
  logprobs; its ``global_steps`` is the last attempt's for every id;
- ``AttemptKeepingClient`` returns the same joined ids with every attempt as a segment, versions as the engine
  generated them (the truth log), and verl's ``min/max_global_steps``;
- verl_ext's loops swap verl's client for it (``keep_attempts``): ``verl_ext_tool_agent`` and the audited stock loop
  record the resumed turn's segments."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from async_harness import verl_async_client, weight_update_when_parked
from loop_harness import DEMO_TOOLS, load_tools, verl_config

from verl_ext.core.version_spans import SEG_IDS, SEG_START, SEG_VERSION
from verl_ext.engines.cpu import CPUGenerationServer
from verl_ext.engines.cpu_pause import ids_digest, read_truth
from verl_ext.engines.sglang_output import ENGINE_FIELD
from verl_ext.plugin.resume_client import SEGMENTS_FIELD, AttemptKeepingClient, keep_attempts

PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True, "ignore_eos": True, "max_tokens": 12}
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call><|im_end|>'
PROMPT = [{"role": "user", "content": "What is 12 * 7? Use the calculator."}]


@pytest.fixture(scope="module")
def config(tiny_qwen3_dir: Path) -> Any:
    return verl_config(
        [
            f"actor_rollout_ref.model.path={tiny_qwen3_dir}",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.multi_turn.format=hermes",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
            "actor_rollout_ref.rollout.prompt_length=512",
            "actor_rollout_ref.rollout.response_length=48",
            "actor_rollout_ref.rollout.name=verl_ext_cpu",
            "trainer.v1.trainer_mode=colocate_async",
        ]
    )


@pytest.fixture(scope="module")
def tokenizer(tiny_qwen3_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))


@pytest.fixture(scope="module")
def prompt_ids(tokenizer: Any) -> list[int]:
    return list(tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True, return_dict=False))


@pytest.fixture
def make_loop(config: Any, tokenizer: Any, tmp_path: Path) -> Callable[..., Any]:
    """``make_loop(loop_class, srv, **kwargs)``: the agent loop as verl's colocated async trainer builds it, over
    verl's resume client on the CPU engine ``srv``, on the demo tools, recording under tmp_path/records
    (``kwargs``: the loop's own arguments, e.g. ``harness``)."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    def make(loop_class: type, srv: CPUGenerationServer, **kwargs: Any) -> Any:
        return loop_class(
            trainer_config=DictConfigWrap(config),
            server_manager=verl_async_client(config, srv),
            tokenizer=tokenizer,
            processor=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(config.data),
            tools=ToolListWrap(load_tools(DEMO_TOOLS)),
            hf_model_type="qwen3",
            verl_ext={"records": {"dir": str(tmp_path / "records")}},
            **kwargs,
        )

    return make


def engine(model_dir: Path, tmp_path: Path, force_text: str | None = None) -> CPUGenerationServer:
    srv = CPUGenerationServer(
        str(model_dir),
        prompt_length=512,
        response_length=48,
        seed=0,
        force_text=force_text,
        faults=[{"kind": "abort_after", "tokens": 3}],
        truth_log=str(tmp_path / "truth.jsonl"),
    )
    asyncio.run(srv.set_global_steps(0))
    return srv


def across_update(srv: CPUGenerationServer, work: Any) -> Any:
    async def both() -> Any:
        out, _ = await asyncio.gather(work, weight_update_when_parked(srv, 1))
        return out

    return asyncio.run(both())


def run_loop_across_update(loop: Any, srv: CPUGenerationServer) -> Any:
    """One rollout of ``loop`` on PROMPT (the loop's sampling params: no token cap) while the weights update to
    version 1 once a request is parked; its output."""
    params = {k: v for k, v in PARAMS.items() if k not in ("max_tokens", "ignore_eos")}

    async def both() -> Any:
        out, _ = await asyncio.gather(loop.run(params, raw_prompt=PROMPT), weight_update_when_parked(srv, 1))
        return out

    return loop.loop.run_until_complete(both())


def test_verls_resume_client_drops_the_attempts(config, prompt_ids, tiny_qwen3_dir, tmp_path) -> None:
    srv = engine(tiny_qwen3_dir, tmp_path)
    client = verl_async_client(config, srv)
    out = across_update(srv, client.generate("r", prompt_ids=prompt_ids, sampling_params=dict(PARAMS)))
    assert len(out.token_ids) == 12 and len(out.log_probs) == 12  # resumed and joined, invisibly
    assert ENGINE_FIELD not in out.extra_fields and SEGMENTS_FIELD not in out.extra_fields  # the reports are gone
    assert out.extra_fields["global_steps"] == 1  # the last attempt's, for all 12 ids: 3 of them came from 0
    assert out.extra_fields["max_global_steps"] == 1  # min: the first attempt's version read on return (0 or 1)
    truth = read_truth(tmp_path / "truth.jsonl")
    assert truth[ids_digest([*prompt_ids, *out.token_ids[:3]])]["version"] == 0  # where the split was


def test_verl_exts_client_keeps_every_attempt(config, prompt_ids, tiny_qwen3_dir, tmp_path) -> None:
    srv = engine(tiny_qwen3_dir, tmp_path)
    client = keep_attempts(verl_async_client(config, srv))
    assert isinstance(client, AttemptKeepingClient)
    out = across_update(srv, client.generate("r", prompt_ids=prompt_ids, sampling_params=dict(PARAMS)))
    assert len(out.token_ids) == 12 and len(out.log_probs) == 12 and out.stop_reason == "length"
    segments = out.extra_fields[SEGMENTS_FIELD]
    assert [(s[SEG_START], s[SEG_IDS], s[SEG_VERSION]) for s in segments] == [(0, 3, 0), (3, 9, 1)]
    assert [x for s in segments for x in s["log_probs"]] == out.log_probs  # each attempt's own logprobs
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (0, 1)
    truth = read_truth(tmp_path / "truth.jsonl")
    for s in segments:  # each segment's version is the version the engine generated its ids on
        stream = [*prompt_ids, *out.token_ids[: s[SEG_START] + s[SEG_IDS]]]
        assert truth[ids_digest(stream)]["version"] == s[SEG_VERSION]


def test_keep_attempts_swaps_verls_client_only_and_once(config, tiny_qwen3_dir, tmp_path) -> None:
    from verl.workers.rollout.llm_server import LLMServerClient

    srv = engine(tiny_qwen3_dir, tmp_path)
    verls = verl_async_client(config, srv)
    assert keep_attempts(verls) is keep_attempts(verls)  # one per client: the balancer's fields are read once
    plain = LLMServerClient(config=config, load_balancer_handle=None)
    assert keep_attempts(plain) is plain  # the sync trainer's client never resumes: verl_ext's loop continues turns


def _records(path: Path) -> list[dict[str, Any]]:
    lines = [json.loads(x) for f in path.glob("*.jsonl") for x in f.read_text().splitlines()]
    return [r for r in lines if r["type"] == "rollout"]


@pytest.mark.parametrize("stock", [False, True], ids=["verl_ext_tool_agent", "audited_stock_loop"])
def test_loops_record_the_resumed_turn(make_loop, tiny_qwen3_dir, tmp_path, stock: bool) -> None:
    from verl_ext.plugin.agent_loop import VerlExtToolAgentLoop
    from verl_ext.plugin.audit_loop import AuditedToolAgentLoop

    srv = engine(tiny_qwen3_dir, tmp_path, force_text=CALL)  # turn 0 forced (a tool call), turn 1 sampled: parked
    loop = make_loop(AuditedToolAgentLoop if stock else VerlExtToolAgentLoop, srv)
    assert isinstance(loop.server_manager, AttemptKeepingClient)
    out = run_loop_across_update(loop, srv)
    (record,) = _records(tmp_path / "records")
    assert record["check"]["engine_ok"], record["check"]
    (resumed,) = record["resumed_turns"]
    assert resumed["turn"] == 1
    assert [(s[SEG_START], s[SEG_VERSION]) for s in resumed["segments"]] == [(0, 0), (3, 1)]
    calls = record["versions"]["calls"]  # every engine call's attempts: [version, start, end, ...]
    assert len(calls) == len(record["engine_calls"]) == 2 and [row[:2] for row in calls[1]] == [[0, 0], [1, 3]]
    assert SEGMENTS_FIELD not in out.extra_fields  # recorded, not handed to verl's batch


def test_a_harness_request_across_a_weight_update_is_one_engine_call_with_two_attempts(
    make_loop, tiny_qwen3_dir, tmp_path, monkeypatch
) -> None:
    """verl_ext_gateway_agent under verl's resume client: the harness's second request (after the tool result) is
    held after 3 ids, the weights are updated, the request resumes on them; the harness (the openai SDK, over HTTP)
    gets one answer, and the branch's record has that turn as one engine call of two attempts, on versions 0 and 1."""
    from verl_ext.plugin.gateway_loop import VerlExtGatewayAgentLoop

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "gateway"))  # the harness module
    srv = engine(tiny_qwen3_dir, tmp_path, force_text=CALL)
    loop = make_loop(VerlExtGatewayAgentLoop, srv, harness={"function": "sdk_harness:loop_react"})
    assert isinstance(loop.server_manager, AttemptKeepingClient)
    out = run_loop_across_update(loop, srv)
    assert out.extra_fields["harness_result"]["turns"] == 2  # two answers: the abort never reached the harness
    (record,) = _records(tmp_path / "records")
    assert record["check"]["engine_ok"] and record["loop"] == "verl_ext_gateway_agent"
    calls = record["versions"]["calls"]
    assert len(calls) == len(record["engine_calls"]) == 2
    assert [row[:3] for row in calls[1]] == [[0, 0, 3], [1, 3, len(record["engine_calls"][1]["output_ids"])]]
    truth = read_truth(tmp_path / "truth.jsonl")
    prompt = record["input_ids"][: record["engine_calls"][1]["prompt_length"]]
    assert truth[ids_digest([*prompt, *record["engine_calls"][1]["output_ids"][:3]])]["version"] == 0
