"""The ``gateway`` preset of the ``verl_ext`` group, composed with verl's real ppo_trainer config, and the driver's
preflight of its harness: a harness that can run is accepted and named in one line; one that cannot (nothing named,
an unimportable or uncallable function, a missing program, ``branches: all`` where verl's trainer cannot train every
branch: v0, an estimator other than GRPO, distillation) stops the driver in one line naming the option and the fix."""

from __future__ import annotations

import re
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from loop_harness import REPO, verl_config
from omegaconf import OmegaConf

from verl_ext.configs import CONFIG_DIR
from verl_ext.plugin.harness_options import HarnessOptions, check_command, resolve_function
from verl_ext.plugin.options import _KNOWN, LoopOptions, OptionsError
from verl_ext.plugin.preflight import check_config

LOOP_KEY = "actor_rollout_ref.rollout.agent.default_agent_loop"
SDK_HARNESS = "sdk_harness:loop_react"  # tests/gateway/sdk_harness.py: a ReAct calculator on the openai SDK


@pytest.fixture(autouse=True)
def harness_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(REPO / "tests" / "gateway"))


@cache
def _preset(preset: str) -> Any:
    return verl_config([f"+verl_ext={preset}"])


def config(preset: str, overrides: list[str] = ()) -> Any:
    """The preset composed with verl's trainer config by Hydra (once per preset: a compose takes seconds on 2 cores),
    then ``KEY=VALUE`` overrides applied as Hydra would apply them to these keys (``+KEY`` adds one)."""
    cfg = _preset(preset).copy()
    OmegaConf.set_struct(cfg, False)
    return OmegaConf.merge(cfg, OmegaConf.from_dotlist([o.removeprefix("+") for o in overrides]))


def test_the_preset_switches_the_gateway_loop_on_with_its_harness() -> None:
    cfg = verl_config(["+verl_ext=gateway", f"verl_ext.harness.function={SDK_HARNESS}"])  # Hydra's own override
    assert OmegaConf.select(cfg, LOOP_KEY) == "verl_ext_gateway_agent"
    rollout = cfg.actor_rollout_ref.rollout
    assert rollout.multi_turn.enable is True and rollout.calculate_log_probs is True
    assert cfg.verl_ext.check.mode == "warn"
    lines = check_config(cfg)
    assert lines[0].startswith("verl_ext: options checked before Ray starts: loop verl_ext_gateway_agent, check warn")
    assert lines[1] == (
        f"verl_ext: verl_ext_gateway_agent runs the harness function {SDK_HARNESS} (timeout 600 s, at most 8 "
        "branches, trains the last)"
    )


def test_the_preset_lists_every_harness_option_at_its_default() -> None:
    harness = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "verl_ext" / "gateway.yaml"))["verl_ext"]["harness"]
    assert set(harness) == _KNOWN["harness"]
    assert HarnessOptions.from_mapping(harness) == HarnessOptions() == LoopOptions().harness


def test_a_command_harness_whose_program_exists_is_accepted(tmp_path: Path) -> None:
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\necho '{}'\n")
    script.chmod(0o755)
    for command in (f"{sys.executable} -m my_agent --turns 3", f"MODE=eval {script}", "cd /tmp && ./anything"):
        cfg = config("gateway", [f"verl_ext.harness.command='{command}'"])
        assert check_config(cfg)[1].startswith(f"verl_ext: verl_ext_gateway_agent runs the harness command {command!r}")


def test_the_loop_entry_harness_key_is_read_over_the_section(tmp_path: Path) -> None:
    loops = tmp_path / "loops.yaml"
    entry = "- name: my_gateway\n  _target_: verl_ext.plugin.gateway_loop.VerlExtGatewayAgentLoop\n  harness:\n"
    loops.write_text(entry + f"    function: {SDK_HARNESS}\n    max_branches: 2\n")
    path = f"actor_rollout_ref.rollout.agent.agent_loop_config_path={loops}"
    lines = check_config(config("gateway", [f"{LOOP_KEY}=my_gateway", path]))
    assert lines[1].startswith(f"verl_ext: my_gateway runs the harness function {SDK_HARNESS} (timeout 600 s, at most")
    assert "at most 2 branches" in lines[1]
    loops.write_text(entry + "    timeout_s: 0\n")
    with pytest.raises(OptionsError, match=rf"^{loops}: the harness key of agent loop 'my_gateway': harness.timeout_s"):
        check_config(config("gateway", [f"{LOOP_KEY}=my_gateway", path]))


def test_a_harness_set_for_another_loop_is_said_to_be_unused() -> None:
    lines = check_config(config("warn", [f"+verl_ext.harness.function={SDK_HARNESS}"]))
    assert lines[1].startswith("verl_ext: WARNING: verl_ext.harness is set but ") and "is not used" in lines[1]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ([], r"^verl_ext_gateway_agent has no harness: set verl_ext.harness.function=module:function"),
        (["verl_ext.harness.function=no_such_agents.calc:run"],
         r"^verl_ext.harness.function=no_such_agents.calc:run: cannot import no_such_agents.calc \(ModuleNotFoundError"
         r".*Fix: a module on the Python path of every node"),
        (["verl_ext.harness.function=sdk_harness:loop_reactt"], r"sdk_harness has no loop_reactt\. Fix"),
        (["verl_ext.harness.function=sdk_harness:_OPS"], r"_OPS is a dict, not a function"),
        (["verl_ext.harness.function=sdk_harness:calculate"],
         r"calculate cannot be called with the keywords base_url, api_key, row .*Fix: def calculate"),
        (["verl_ext.harness.function=sdk_harness"], r"verl_ext.harness.function must be module:function"),
        (["verl_ext.harness.command='no-such-agent --fast'"], r"no program 'no-such-agent' on PATH in the driver"),
        (["verl_ext.harness.command='./agents/missing.sh'"], r"\./agents/missing.sh does not exist \(relative paths"),
        (["verl_ext.harness.command='python -c \"1'"], r"does not parse as a shell line"),
        ([f"verl_ext.harness.function={SDK_HARNESS}", "verl_ext.harness.command=agent"],
         r"^verl_ext.harness: both function .* and command .* are set"),
        ([f"verl_ext.harness.function={SDK_HARNESS}", "verl_ext.harness.branches=all", "trainer.use_v1=false",
          "algorithm.adv_estimator=grpo"],
         r"^verl_ext.harness.branches=all needs verl's v1 trainer: verl 0.9.1's v0 trainer takes exactly one "
         r"agent-loop output per row, so a session can hand it one branch only\. Fix: trainer.use_v1=true \(the "
         r"default\), or verl_ext.harness.branches=last \(the session's last branch is trained; every branch is still "
         r"checked and recorded\)$"),
        ([f"verl_ext.harness.function={SDK_HARNESS}", "verl_ext.harness.branches=all"],  # verl's default: gae
         r"^verl_ext.harness.branches=all needs algorithm.adv_estimator=grpo, got gae: .*last output's advantage only "
         r"under GRPO .*Fix: algorithm.adv_estimator=grpo, or verl_ext.harness.branches=last"),
        ([f"verl_ext.harness.function={SDK_HARNESS}", "verl_ext.harness.branches=all", "algorithm.adv_estimator=grpo",
          "distillation.enabled=true"],
         r"^verl_ext.harness.branches=all does not work with distillation.enabled=true: .*teacher logprobs for a "
         r"session's last output only\. Fix: distillation.enabled=false, or verl_ext.harness.branches=last"),
        ([f"verl_ext.harness.function={SDK_HARNESS}", "verl_ext.harness.branches=first"],
         r"branches must be 'last' \(the session's last branch is trained\) or 'all'"),
        ([f"verl_ext.harness.function={SDK_HARNESS}", "verl_ext.harness.timeout_s=0"], r"timeout_s must be a positive"),
        ([f"verl_ext.harness.function={SDK_HARNESS}", "verl_ext.harness.max_branches=0"], r"max_branches must be"),
        ([f"verl_ext.harness.function={SDK_HARNESS}", "+verl_ext.harness.fucntion=x"],
         r"unknown option verl_ext.harness.fucntion; .*did you mean verl_ext.harness.function\?"),
    ],
)  # fmt: skip
def test_a_harness_that_cannot_run_stops_the_driver_in_one_line(overrides: list[str], message: str) -> None:
    cfg = config("gateway", overrides)
    with pytest.raises(OptionsError) as raised:
        check_config(cfg)
    assert re.search(message, str(raised.value)) and "\n" not in str(raised.value), str(raised.value)


def test_branches_all_is_accepted_under_verls_v1_trainer_with_grpo() -> None:
    overrides = [f"verl_ext.harness.function={SDK_HARNESS}", "verl_ext.harness.branches=all"]
    lines = check_config(config("gateway", [*overrides, "algorithm.adv_estimator=grpo"]))
    assert lines[1] == (
        f"verl_ext: verl_ext_gateway_agent runs the harness function {SDK_HARNESS} (timeout 600 s, at most 8 "
        "branches, trains every branch, each engine turn once)"
    )


def test_a_file_that_is_not_executable_is_refused(tmp_path: Path) -> None:
    script = tmp_path / "agent.sh"
    script.write_text("echo hi\n")
    with pytest.raises(OptionsError, match="agent.sh is not an executable file"):
        check_command(str(script))
    script.chmod(0o755)
    check_command(str(script))


def test_a_harness_module_that_raises_on_import_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_agent.py").write_text("raise RuntimeError('no API key\\nin the environment')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(OptionsError, match=r"cannot import broken_agent \(RuntimeError: no API key in the environment"):
        resolve_function("broken_agent:run")


def test_verls_validate_config_prints_the_harness_error_last_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    # main_ppo calls validate_config before ray.init; the plugin wraps it (test_configs runs main_ppo itself)
    import verl.utils.config

    with pytest.raises(SystemExit) as exited:
        verl.utils.config.validate_config(config("gateway", ["verl_ext.harness.function=nope:run"]), False, False)
    assert exited.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1].strip()
    assert last.startswith("verl_ext.harness.function=nope:run: cannot import nope (ModuleNotFoundError"), last


# -- where branches: all is sound, held to verl's own code (a verl upgrade that changes it fails here) -------------
def test_verls_v0_worker_takes_one_output_per_row() -> None:
    import asyncio

    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, AgentLoopWorker

    output = AgentLoopOutput(prompt_ids=[1], response_ids=[2], response_mask=[1], num_turns=1, metrics={})
    with pytest.raises(AttributeError, match="'list' object has no attribute 'extra_fields'"):
        asyncio.run(AgentLoopWorker._agent_loop_postprocess(None, [output, output], False, raw_prompt=[]))


def test_verls_v1_grpo_gives_every_output_of_a_session_the_last_ones_advantage() -> None:
    import numpy as np
    import torch
    from verl import DataProto
    from verl.trainer.ppo.v1.utils import compute_advantage_for_multi_trajectories

    # one prompt, a GRPO group of 2 sessions; session 0 returned two outputs (two branches) rewarded 5.0 then 0.0,
    # session 1 one output rewarded 1.0
    rewards = torch.tensor([[0.0, 5.0], [0.0, 0.0], [0.0, 1.0]])
    data = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": torch.ones(3, 2, dtype=torch.int64)},
        non_tensors={"uid": np.array(["u"] * 3, dtype=object)},
    )
    keys = ["u_0_0", "u_0_1", "u_1_0"]  # {uid}_{session}_{output}, as v1's worker stores them
    advantages = compute_advantage_for_multi_trajectories(data, keys, "grpo", num_repeat=2).batch["advantages"]
    assert torch.equal(advantages[0], advantages[1]) and advantages[0][0] < 0 < advantages[2][0]  # 5.0 is not seen


def test_verls_v1_worker_passes_each_session_its_id_and_stores_its_outputs_as_a_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import asyncio
    from types import SimpleNamespace

    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
    from verl.trainer.ppo.v1 import agent_loop_tq

    puts: list[dict[str, Any]] = []

    async def kv_put(**kwargs: Any) -> None:
        pass

    async def kv_batch_put(**kwargs: Any) -> None:
        puts.append(kwargs)

    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_put", kv_put)
    monkeypatch.setattr(agent_loop_tq.tq, "async_kv_batch_put", kv_batch_put)
    worker = object.__new__(agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__)
    worker.reward_loop_worker_handles, worker.distillation_enabled, worker.processor = None, False, None
    # each of a row's rollout.n loops gets its session_id (the gateway loop's sign that a list is taken)
    seen: list[dict[str, Any]] = []

    async def run_agent_loop(sampling_params: Any, trajectory: Any, trace: bool, **kwargs: Any) -> None:
        seen.append(kwargs)

    worker._run_agent_loop = run_agent_loop
    worker.config = SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=SimpleNamespace(n=2)))
    asyncio.run(worker._run_prompt({"uid": "u"}, {}, trajectory={"validate": False}))
    assert [s["session_id"] for s in seen] == [0, 1]
    # a loop's list of outputs is stored as {uid}_{session}_{index}, each with its response_mask as the loss mask
    outputs = [
        AgentLoopOutput(prompt_ids=[1], response_ids=[2, 3], response_mask=mask, num_turns=1, metrics={})
        for mask in ([0, 1], [1, 1])
    ]
    asyncio.run(worker._agent_loop_postprocess(outputs, False, uid="u", session_id=1, global_steps=4))
    (put,) = puts
    assert put["keys"] == ["u_1_0", "u_1_1"]
    assert [put["fields"]["loss_mask"][i].tolist() for i in range(2)] == [[0, 1], [1, 1]]
