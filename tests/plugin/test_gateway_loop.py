"""verl_ext_gateway_agent in process: verl's loop config and tools, the CPU engine as verl's server, and a harness
written against the OpenAI SDK that reaches the loop's gateway over HTTP."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from loop_harness import RecordingServer, load_tools, run_loop, verl_config

from verl_ext.core.errors import OptionsError
from verl_ext.plugin import metrics_sink
from verl_ext.plugin.gateway_loop import _WORKERS, HarnessOptions

REPO = Path(__file__).resolve().parents[2]
PROMPT = [{"role": "system", "content": "Use the calculator tool."}, {"role": "user", "content": "What is 12 * 7?"}]
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call><|im_end|>'


@pytest.fixture
def gateway_loop(tiny_qwen3_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_ext.engines.cpu import CPUGenerationServer
    from verl_ext.plugin.gateway_loop import VerlExtGatewayAgentLoop

    monkeypatch.syspath_prepend(str(REPO / "tests" / "gateway"))  # the harness module

    def make(
        harness: str | None = None,
        command: str | None = None,
        prompt_length: int = 512,
        section: dict[str, Any] | None = None,
        overrides: list[str] = (),
    ) -> tuple[Any, RecordingServer]:
        cfg = verl_config(
            [
                f"actor_rollout_ref.model.path={tiny_qwen3_dir}",
                "actor_rollout_ref.rollout.multi_turn.enable=true",
                "actor_rollout_ref.rollout.multi_turn.format=hermes",
                f"actor_rollout_ref.rollout.prompt_length={prompt_length}",
                "actor_rollout_ref.rollout.response_length=96",
                *overrides,
            ]
        )
        server = RecordingServer(
            CPUGenerationServer(str(tiny_qwen3_dir), prompt_length=512, response_length=96, force_text=CALL)
        )
        loop = VerlExtGatewayAgentLoop(
            trainer_config=DictConfigWrap(cfg),
            server_manager=server,
            tokenizer=AutoTokenizer.from_pretrained(str(tiny_qwen3_dir)),
            processor=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(cfg.data),
            tools=ToolListWrap(load_tools(REPO / "verl_ext" / "demo" / "tools.py")),
            hf_model_type="qwen3",
            verl_ext={"records": {"dir": str(tmp_path / "records")}, "harness": section},
            harness={"function": harness} if harness else {"command": command, "timeout_s": 120} if command else None,
        )
        return loop, server

    return make


def test_harness_rollout_is_the_engines_tokens_checked_and_recorded(gateway_loop: Any, tmp_path: Path) -> None:
    metrics_sink.drain()
    loop, server = gateway_loop("sdk_harness:loop_react")
    server.server.global_steps = 7  # the weights' step, as a weight sync sets it
    out = run_loop(loop, PROMPT)
    assert out.extra_fields["harness_result"]["turns"] == 2
    assert out.extra_fields["verl_ext_check"]["engine_ok"], out.extra_fields["verl_ext_check"]
    first, second = server.requests
    assert "<tool_response>\n84\n</tool_response>" in loop.tokenizer.decode(second["prompt_ids"])
    stream = out.prompt_ids + out.response_ids
    assert stream[: len(first["prompt_ids"])] == first["prompt_ids"]  # one stream: each prompt extends the last
    assert stream[: len(second["prompt_ids"])] == second["prompt_ids"]
    assert sum(out.response_mask) == len(first["output_ids"]) + len(second["output_ids"])
    # the engine's extra fields of the trained calls reach verl (v1 reads the weight versions that served the sample)
    assert out.extra_fields["global_steps"] == 7
    assert not any(w.result().engine.extra_fields for w in _WORKERS.values())  # the session's calls are forgotten
    m = metrics_sink.drain()
    assert m["tito/rollouts_checked"] == 1 and m["tito/engine_view_failures"] == 0
    assert m["tito/gateway/forks"] == 0 and m["tito/gateway/branches"] == 1
    assert "tito/loop/verl_ext_gateway_agent" not in m  # verl's worker counts the loop (loop routing), once
    lines = [json.loads(line) for f in (tmp_path / "records").iterdir() for line in f.read_text().splitlines()]
    assert [r["type"] for r in lines] == ["header", "rollout"]
    assert lines[1]["gateway"]["ended"] == "the harness finished"
    # the row's step (no step passed, as in v0: the served weight version + 1), data source and index
    assert (lines[1]["step"], lines[1]["data_source"], lines[1]["index"]) == (8, None, None)


def test_rollouts_a_worker_starts_together_share_one_gateway_server(
    gateway_loop: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # (one loop built for two checks: a build loads the model) the harness is verl_ext.harness with the entry's over it
    section = {"function": "sdk_harness:loop_failing", "timeout_s": 90}
    loop, server = gateway_loop("sdk_harness:loop_react", section=section)
    assert (loop.harness.function, loop.harness.timeout_s) == ("sdk_harness:loop_react", 90.0)
    event_loop = loop.loop
    earlier = _WORKERS.pop(id(event_loop), None)
    if earlier is not None:  # another test's gateway on this event loop: stopped, so this one starts afresh
        earlier.result().server.should_exit = True
    rows = {t: [PROMPT[0], {"role": "user", "content": f"What is {t} * 7?"}] for t in (1.0, 0.5, 0.0)}
    runs = []
    for temperature, prompt in rows.items():  # rows with their own sampling, as validation rows have
        params = {"temperature": temperature, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
        runs.append(loop.run(params, raw_prompt=prompt))
    with caplog.at_level(logging.INFO, logger="verl_ext.plugin"):
        outs = event_loop.run_until_complete(asyncio.gather(*runs))
    started = [r for r in caplog.records if "gateway serving on" in r.getMessage()]
    assert len(started) == 1, [r.getMessage() for r in started]
    assert all(o.extra_fields["verl_ext_check"]["engine_ok"] for o in outs) and len(server.requests) == 6
    for request in server.requests:  # each engine call had its own row's sampling parameters
        text = loop.tokenizer.decode(request["prompt_ids"])
        (temperature,) = [t for t in rows if f"What is {t} * 7?" in text]
        assert request["sampling_params"]["temperature"] == temperature


def test_failing_harness_trains_nothing_and_says_why(gateway_loop: Any, tmp_path: Path) -> None:
    metrics_sink.drain()
    loop, _ = gateway_loop("sdk_harness:loop_failing")
    out = run_loop(loop, PROMPT, global_steps=5, data_source="calc", index=3)
    assert sum(out.response_mask) == 0
    # verl's v1 trainer reads these from every sample (an int each): the untrained one has them too
    assert (out.extra_fields["min_global_steps"], out.extra_fields["max_global_steps"]) == (5, 5)
    assert "the harness gave up" in out.extra_fields["verl_ext_gateway"]["failed"]
    m = metrics_sink.drain()
    assert m["tito/gateway/harness_failed"] == 1
    lines = [json.loads(line) for f in (tmp_path / "records").iterdir() for line in f.read_text().splitlines()]
    assert "the harness gave up" in lines[1]["gateway"]["ended"]  # its one branch is still recorded
    assert (lines[1]["step"], lines[1]["data_source"], lines[1]["index"]) == (5, "calc", 3)  # v1 passes the step


SDK_COMMAND = """
import json, openai
client = openai.OpenAI(max_retries=0)  # OPENAI_BASE_URL and OPENAI_API_KEY come from the loop
response = client.chat.completions.create(model="p", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
print("progress line")
print(json.dumps({"tokens": response.usage.completion_tokens}))
"""


def test_command_harness_gets_the_session_url_and_its_last_line_is_the_result(
    gateway_loop: Any, tmp_path: Path
) -> None:
    script = tmp_path / "agent.py"
    script.write_text(SDK_COMMAND)
    loop, server = gateway_loop(command=f"{sys.executable} {script}")
    out = run_loop(loop, PROMPT)
    assert out.extra_fields["harness_result"] == {"tokens": len(server.requests[0]["output_ids"])}
    assert sum(out.response_mask) == len(server.requests[0]["output_ids"])


def test_command_harness_exiting_non_zero_trains_nothing(gateway_loop: Any) -> None:
    metrics_sink.drain()
    loop, _ = gateway_loop(command=f"{sys.executable} -c 'import sys; print(\"no\", file=sys.stderr); sys.exit(3)'")
    out = run_loop(loop, PROMPT)
    assert sum(out.response_mask) == 0
    assert out.extra_fields["verl_ext_gateway"]["failed"] == "the harness command exited with status 3: no"
    assert metrics_sink.drain()["tito/gateway/harness_failed"] == 1


def test_harness_prompt_over_prompt_length_trains_nothing(gateway_loop: Any) -> None:
    metrics_sink.drain()
    loop, _ = gateway_loop("sdk_harness:loop_react", prompt_length=64)
    out = run_loop(loop, PROMPT)
    assert sum(out.response_mask) == 0
    assert "more than rollout.prompt_length=64" in out.extra_fields["verl_ext_gateway"]["failed"]
    assert metrics_sink.drain()["tito/gateway/prompt_over_length"] == 1


def test_branches_all_hands_verls_v1_worker_each_branch_with_each_turn_trained_once(
    gateway_loop: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from verl import DataProto
    from verl.trainer.ppo.v1 import agent_loop_tq
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    metrics_sink.drain()
    loop, server = gateway_loop(
        "sdk_harness:loop_forking", section={"branches": "all"}, overrides=["algorithm.adv_estimator=grpo"]
    )
    with pytest.raises(OptionsError, match=r"needs verl's v1 trainer: .*this rollout's worker passed no session_id"):
        run_loop(loop, PROMPT, global_steps=3)  # as v0's worker calls a loop: it takes one output per row
    outs = run_loop(loop, PROMPT, global_steps=3, uid="u", session_id=0)  # as v1's worker calls a loop
    assert isinstance(outs, list) and len(outs) == 2
    first, second, forked = server.requests  # the call, the answer; the fork's answer after the edited result
    shared, own, fork_own = (len(r["output_ids"]) for r in (first, second, forked))
    parent, fork = outs
    assert all(o.extra_fields["verl_ext_check"]["engine_ok"] for o in outs)
    assert fork.prompt_ids == parent.prompt_ids and fork.response_ids[:shared] == parent.response_ids[:shared]
    assert parent.response_mask[:shared] == [0] * shared and sum(parent.response_mask) == own  # left to the fork
    assert fork.response_mask[:shared] == [1] * shared and sum(fork.response_mask) == shared + fork_own
    trains = [o.extra_fields["verl_ext_gateway"]["trains"] for o in outs]
    assert trains == [
        {"turns": [1], "tokens": own, "elsewhere": [{"turn": 0, "branch": 1}]},
        {"turns": [0, 1], "tokens": shared + fork_own},
    ]
    m = metrics_sink.drain()
    counted = (m["tito/gateway/samples"], m["tito/gateway/shared_tokens_masked"], m["tito/gateway/forks"])
    assert counted == (2, shared, 1)
    # tito/async counts each engine call once, in the branch that trains it: the call the fork replayed is not
    # counted in its parent too (LiveRollout.trainer_mask over the turns each branch trains)
    tokens = m["tito/async/versioned_tokens"] + m["tito/async/unstamped_tokens"]
    assert (m["tito/async/turns"], tokens) == (3, shared + own + fork_own)
    lines = [json.loads(line) for f in (tmp_path / "records").iterdir() for line in f.read_text().splitlines()]
    assert [r["gateway"]["trains"] for r in lines[1:]] == trains  # each branch's record says what it trains

    # verl's own v1 worker stores both outputs of the session, the last one last, each with its loss mask
    stored: dict[str, Any] = {}

    async def kv_batch_put(keys: list[str], fields: Any, tags: Any, partition_id: str) -> None:
        stored.update(keys=keys, fields=fields)

    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_batch_put", kv_batch_put)
    worker = object.__new__(agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__)
    worker.reward_loop_worker_handles, worker.distillation_enabled, worker.processor = None, False, None
    asyncio.run(worker._agent_loop_postprocess(outs, False, uid="u", session_id=0, global_steps=3))
    assert stored["keys"] == ["u_0_0", "u_0_1"]
    loss_masks = [stored["fields"]["loss_mask"][i].tolist() for i in range(2)]
    assert loss_masks == [parent.response_mask, fork.response_mask]
    # and its GRPO gives the parent's own turn the fork's advantage; the shared turn trains once, in the fork
    width = max(len(o.response_ids) for o in outs)
    masks = torch.tensor([mask + [0] * (width - len(mask)) for mask in loss_masks] + [[1] * width])
    rewards = torch.zeros(3, width)
    rewards[1, len(fork.response_ids) - 1] = 1.0  # the session's reward, at its last output; another session: 0
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": masks},
        non_tensors={"uid": np.array(["u"] * 3, dtype=object)},
    )
    keys = [*stored["keys"], "u_1_0"]
    advantages = compute_advantage_for_multi_trajectories(data, keys, "grpo", num_repeat=2).batch["advantages"]
    trained = advantages[:2] != 0
    assert trained[0].sum() == own and trained[1].sum() == shared + fork_own
    assert not trained[0][:shared].any() and trained[1][:shared].all()
    assert advantages[0][trained[0]].unique().tolist() == advantages[1][trained[1]].unique().tolist()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "verl_ext_gateway_agent has no harness: set verl_ext.harness.function"),
        ({"function": "a:b", "command": "x"}, "entry: both function ('a:b') and command ('x') are set"),
        ({"function": "nocolon"}, "entry.function must be module:function"),
        ({"function": "a:b", "branches": "first"}, "entry.branches must be 'last' (the session's last branch"),
        ({"x": 1}, "unknown option entry.x"),
    ],
)
def test_bad_harness_options_are_named(options: dict[str, Any], message: str) -> None:
    with pytest.raises(OptionsError, match=re.escape(message)):
        HarnessOptions.from_mapping(options, where="entry").required()
