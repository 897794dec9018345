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

from verl_ext.core.version_spans import (
    DISPATCH_VERSION_FIELD,
    PROMPT_CRC_FIELD,
    SEG_IDS,
    SEG_START,
    SEG_VERSION,
    STOP_VERSION_FIELD,
    ids_crc,
)
from verl_ext.engines.cpu import CPUGenerationServer
from verl_ext.engines.cpu_pause import ids_digest, read_truth
from verl_ext.engines.sglang_output import ENGINE_FIELD
from verl_ext.plugin.engine_turn import ATTEMPTS_KEY
from verl_ext.plugin.resume_client import SEGMENTS_FIELD, AttemptKeepingClient, keep_attempts
from verl_ext.plugin.trainer_mode import resumes_aborted_requests

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
    """``make_loop(loop_class, srv, cfg=None, **kwargs)``: the agent loop as verl's colocated async trainer builds
    it, over verl's resume client on the CPU engine ``srv`` (none where ``srv`` is None: a loop only built), on the
    demo tools, recording under tmp_path/records (``cfg``: another trainer config; ``kwargs``: the loop's own
    arguments, e.g. ``harness``)."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    def make(loop_class: type, srv: CPUGenerationServer | None, cfg: Any = None, **kwargs: Any) -> Any:
        cfg = config if cfg is None else cfg
        return loop_class(
            trainer_config=DictConfigWrap(cfg),
            server_manager=verl_async_client(cfg, srv) if srv is not None else None,
            tokenizer=tokenizer,
            processor=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(cfg.data),
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
    # the joined output's report describes the joined output: whole (the last attempt completed), sent on version 0
    # with the turn's prompt, stopped on 1; each attempt's own report kept, the first's incomplete
    report = out.extra_fields[ENGINE_FIELD]
    assert report["complete"] is True, report  # the first attempt's report (complete False) before the fix
    assert (report[DISPATCH_VERSION_FIELD], report[STOP_VERSION_FIELD]) == (0, 1)
    assert report[PROMPT_CRC_FIELD] == ids_crc(prompt_ids)
    assert [(r["complete"], r[DISPATCH_VERSION_FIELD]) for r in report[ATTEMPTS_KEY]] == [(False, 0), (True, 1)]


def _partial_rollout(config: Any, enabled: bool) -> Any:
    """``config`` with fully_async_policy's ``async_training.partial_rollout`` set (verl's own setting)."""
    from omegaconf import OmegaConf, open_dict

    out = OmegaConf.create(OmegaConf.to_container(config))
    with open_dict(out):
        out.async_training = {"partial_rollout": enabled}
    return out


def test_without_partial_rollouts_the_client_resumes_nothing_as_verls(config, prompt_ids, tiny_qwen3_dir, tmp_path):
    """verl's ``async_training.partial_rollout: false``: verl's client hands the aborted attempt back unresumed
    (llm_server.py: ``should_retry`` False); verl_ext's client does the same and keeps the attempt's report."""
    off = _partial_rollout(config, False)
    assert not resumes_aborted_requests(off) and resumes_aborted_requests(_partial_rollout(config, True))
    assert resumes_aborted_requests(config)  # the v1 trainer has no such setting: it always resumes
    srv = engine(tiny_qwen3_dir, tmp_path)
    verls = across_update(
        srv, verl_async_client(off, srv).generate("r", prompt_ids=prompt_ids, sampling_params=dict(PARAMS))
    )
    assert len(verls.token_ids) == 3 and verls.stop_reason == "aborted"
    srv = engine(tiny_qwen3_dir, tmp_path)
    client = keep_attempts(verl_async_client(off, srv))
    out = across_update(srv, client.generate("r", prompt_ids=prompt_ids, sampling_params=dict(PARAMS)))
    assert (out.token_ids, out.stop_reason) == (verls.token_ids, "aborted")  # 12 ids, resumed, before the fix
    (attempt,) = out.extra_fields[SEGMENTS_FIELD]
    assert (attempt[SEG_IDS], attempt[SEG_VERSION]) == (3, 0)
    assert out.extra_fields[ENGINE_FIELD]["complete"] is False  # one attempt: its own report, aborted


def test_mutation_resuming_under_partial_rollout_false_is_caught(
    config, prompt_ids, tiny_qwen3_dir, tmp_path, monkeypatch
):
    """Mutation: verl_ext's client ignores ``partial_rollout: false`` (resumes as before): it hands the loop 12 ids
    where verl's hands 3."""
    import verl_ext.plugin.resume_client as resume_client

    monkeypatch.setattr(resume_client, "resumes_aborted_requests", lambda _config: True)
    srv = engine(tiny_qwen3_dir, tmp_path)
    client = keep_attempts(verl_async_client(_partial_rollout(config, False), srv))
    out = across_update(srv, client.generate("r", prompt_ids=prompt_ids, sampling_params=dict(PARAMS)))
    assert len(out.token_ids) == 12 != 3


@pytest.mark.parametrize("gateway", [False, True], ids=["verl_ext_tool_agent", "verl_ext_gateway_agent"])
def test_verl_exts_loops_refuse_partial_rollout_false_naming_the_fix(config, make_loop, gateway: bool) -> None:
    """verl_ext's own loops never train a turn cut at an abort, which verl hands a loop under ``partial_rollout:
    false``: they refuse the setting, naming it and the fix; the audited stock loop runs (verl's behaviour)."""
    from verl_ext.core.errors import OptionsError
    from verl_ext.plugin.agent_loop import VerlExtToolAgentLoop
    from verl_ext.plugin.audit_loop import AuditedToolAgentLoop
    from verl_ext.plugin.gateway_loop import VerlExtGatewayAgentLoop

    def build(cls: Any, cfg: Any, **extra: Any) -> Any:
        return make_loop(cls, None, cfg, **extra)

    cls = VerlExtGatewayAgentLoop if gateway else VerlExtToolAgentLoop
    extra = {"harness": {"function": "sdk_harness:loop_react"}} if gateway else {}
    name = "verl_ext_gateway_agent" if gateway else "verl_ext_tool_agent"
    with pytest.raises(OptionsError, match=rf"^{name} does not run with async_training\.partial_rollout=false") as e:
        build(cls, _partial_rollout(config, False), **extra)
    assert "Fix: async_training.partial_rollout=true" in str(e.value) and "verl_ext_audited_tool_agent" in str(e.value)
    assert build(cls, _partial_rollout(config, True), **extra).loop_name == name  # resumed turns: it runs
    build(AuditedToolAgentLoop, _partial_rollout(config, False))  # verl's stock loop: verl's behaviour, watched


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
