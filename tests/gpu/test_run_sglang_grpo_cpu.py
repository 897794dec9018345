"""CPU, in CI: everything tests/gpu/run_sglang_grpo.py does short of the GPU (its ``--dry-run``), so the script runs
unmodified on a GPU node: arguments, the model folder built from the shipped tokenizer's folder, a full batch of
data per step, each arm's overrides composed with verl's own config, the server class each arm's replica launches
(with the forced first turn) and the per-rollout turn check behind ``--min-turns``; and the VL arm's wiring (its
tiny VL model folder, processor probe and forced screenshot, overrides, image checks) as far as CPU allows."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).with_name("run_sglang_grpo.py")
REPO = SCRIPT.parents[2]


@pytest.fixture(scope="module")
def script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("run_sglang_grpo", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, text=True, capture_output=True, timeout=600)


def test_the_script_runs_unmodified_up_to_the_gpu(tmp_path: Path) -> None:
    """The script itself, as a GPU node runs it, with --dry-run: it builds the model from the tokenizer folder
    (it once passed a tokenizer object: OSError) and a dataset with a full batch per step (it once wrote 8 rows
    for a batch of 16: StopIteration at the first step), and composes every arm with verl's config. The VL arm:
    the tiny Qwen2.5-VL folder built from the shipped tokenizer and the VL fixture, its processor probed as
    verl_ext's loop will (placeholder, the forced screenshot's expansion), the forced screenshot call tokenized by
    it, on verl_ext's server."""
    run = run_script("--out", str(tmp_path), "--steps", "3", "--dry-run", "--arms", "verl_ext", "stock", "verl_ext_vl")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = [line for line in run.stdout.splitlines() if line.startswith("preflight:")]
    assert any("verl_ext: loop verl_ext_tool_agent, server ForcedFirstTurnTokenExactSGLangServer" in x for x in lines)
    assert any("stock: loop verl_ext_audited_tool_agent, server ForcedFirstTurnStockSGLangServer" in x for x in lines)
    vl_arm = "verl_ext_vl: loop verl_ext_tool_agent, server ForcedFirstTurnTokenExactSGLangServer"
    assert any(vl_arm in x for x in lines)
    arms = [x for x in lines if ", server " in x]
    assert len(arms) == 3 and all(x.endswith("3 batches of 16 for 3 steps") for x in arms)
    checked = [x for x in lines if "options checked before Ray starts" in x]  # verl_ext's own preflight, per arm
    assert len(checked) == 3 and all("agent_name column" in x for x in checked)
    model = tmp_path / "tiny-qwen3"
    assert (model / "config.json").is_file() and (model / "tokenizer.json").is_file()
    vl_model = tmp_path / "tiny-vl"
    assert any(f"model {vl_model}: vocab 151936, forced turn" in x for x in lines)
    assert any("placeholder id 151655, the forced screenshot (112x56) -> grid [1, 4, 8], 8 placeholders" in x
               for x in lines)  # fmt: skip
    assert (vl_model / "preprocessor_config.json").is_file() and (vl_model / "chat_template.jinja").is_file()
    assert not (tmp_path / "summary.json").exists()  # nothing ran


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "0"], "--steps and --min-turns must be at least 1"),
        (["--min-turns", "0"], "--steps and --min-turns must be at least 1"),
        (["--model", "/nonexistent/model"], "no config.json there"),
        (["--arms", "vllm"], "invalid choice"),
    ],
)
def test_bad_arguments_are_refused_with_a_message(script: ModuleType, args: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        script.parse_args(args)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_prepare_writes_a_full_batch_per_step(script: ModuleType, tmp_path: Path) -> None:
    import pandas as pd

    model = tmp_path / "given-model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # a given model is used as it is, never rebuilt
    paths = script.prepare(tmp_path, model, steps=5, seed=0)
    assert paths["model"] == model
    assert len(pd.read_parquet(paths["train"])) == script.TRAIN_BATCH * 5


def test_every_arm_carries_the_gpu_overrides_and_the_forced_turn(script: ModuleType, tmp_path: Path) -> None:
    from verl_ext.engines.forced_turn import FORCED_TOOL_CALL, SGLANG_FORCE_ENV
    from verl_ext.engines.sglang_output import SWITCH_ENV

    paths = {"model": tmp_path / "m", "train": tmp_path / "t.parquet", "val": tmp_path / "v.parquet"}
    needed = {
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=triton",
        "+actor_rollout_ref.rollout.engine_kwargs.sglang.sampling_backend=pytorch",
        "+actor_rollout_ref.rollout.engine_kwargs.sglang.grammar_backend=none",
    }
    paths["vl_model"] = tmp_path / "vl"
    for name, arm in script.ARMS.items():
        cmd = script.command(paths, tmp_path / name, 3, arm, seed=7)
        assert needed <= set(cmd)
        assert f"+verl_ext.records.dir={tmp_path / name / 'records'}" in cmd  # the turn check reads them
        assert "data.seed=7" in cmd and "actor_rollout_ref.rollout.seed=7" in cmd  # the same for both arms
        env = script.arm_env(arm, base={})
        assert env[SGLANG_FORCE_ENV] == (script.FORCED_SCREENSHOT_CALL if arm.vl else FORCED_TOOL_CALL)
        assert env[SWITCH_ENV] == ("0" if name == "stock" else "1")
        vl_only = {o for o, _ in script.VL_OVERRIDES}
        assert bool(vl_only & set(cmd)) is arm.vl and (vl_only <= set(cmd) or not arm.vl)
        model = paths["vl_model"] if arm.vl else paths["model"]
        assert f"actor_rollout_ref.model.path={model}" in cmd
        tools = "screenshot_tool.py" if arm.vl else "tools.py"
        assert any(o.startswith("actor_rollout_ref.rollout.multi_turn.function_tool_path=") and o.endswith(tools)
                   for o in cmd)  # fmt: skip
        assert f"actor_rollout_ref.model.use_remove_padding={'false' if arm.vl else 'true'}" in cmd


def test_the_vl_arm_is_asked_for_by_name(script: ModuleType) -> None:
    assert script.parse_args([]).arms == ["verl_ext", "stock"]
    assert script.parse_args(["--arms", "verl_ext_vl"]).arms == ["verl_ext_vl"]


def write_records(path: Path, shapes: list[tuple[int, ...]]) -> None:
    """Rollout records with (engine calls, tool results[, images]) each; a header line first, as verl_ext writes
    them."""
    lines = [json.dumps({"type": "header", "version": 1})]
    for calls, results, *images in shapes:
        messages = [{"role": "user", "content": "q"}]
        for i in range(calls):
            messages.append(
                {"role": "assistant", "content": "", "tool_calls": [{"id": f"c{i}"}] if i < results else []}
            )
            if i < results:
                messages.append({"role": "tool", "content": "84"})
        record = {"type": "rollout", "messages": messages, "engine_calls": [{}] * calls}
        if images:
            record["images"] = [{"digest": f"d{i}"} for i in range(images[0])]
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + "\n")


def test_min_turns_fails_on_a_single_turn_rollout(script: ModuleType, tmp_path: Path) -> None:
    write_records(tmp_path / "a.jsonl", [(2, 1), (3, 2)])
    good = script.summarize({1: {}, 2: {}}, script.rollout_shapes(tmp_path))
    assert good["engine_calls_per_rollout_min"] == 2 and good["tool_calls"] == 3
    assert script.turn_problems("verl_ext", good, 2) == []
    write_records(tmp_path / "b.jsonl", [(1, 0)])  # what an unforced random model does
    bad = script.summarize({1: {}}, script.rollout_shapes(tmp_path))
    problems = script.turn_problems("stock", bad, 2)
    assert any("1 engine calls (< 2)" in p for p in problems) and any("no tool result" in p for p in problems)
    assert script.turn_problems("stock", script.summarize({}, []), 2) == [
        "stock: no rollout records were written (is verl_ext's loop on?)"
    ]


def test_summary_times_the_steps_after_the_first(script: ModuleType) -> None:
    steps = {
        1: {"timing_s/gen": 90.0, "timing_s/step": 120.0, "response_length/mean": 256.0},
        2: {"timing_s/gen": 2.0, "timing_s/step": 5.0, "response_length/mean": 100.0,
            "training/rollout_probs_diff_max": 4e-8, "training/rollout_probs_diff_mean": 1e-9,
            "tito/engine_view_failures": 0.0, "tito/rollouts_with_defects": 1.0, "tito/findings/unknown": 1.0},
    }  # fmt: skip
    s = script.summarize(steps, [])
    assert s["timed_steps"] == 1 and s["gen_seconds_per_step"] == 2.0 and s["step_seconds_per_step"] == 5.0
    assert s["response_tokens_per_second"] == pytest.approx(100.0 * script.ROLLOUTS_PER_STEP / 2.0)
    assert s["rollout_probs_diff_max"] == 4e-8 and s["template_view_findings"] == {"unknown": 1.0}


def test_the_vl_arm_fails_without_an_image_or_on_a_refused_image_prompt(script: ModuleType, tmp_path: Path) -> None:
    write_records(tmp_path / "a.jsonl", [(2, 1, 1), (2, 1, 1)])
    good = script.summarize({1: {}}, script.rollout_shapes(tmp_path))
    assert good["images"] == 2 and script.turn_problems("verl_ext_vl", good, 2) == []
    assert script.turn_problems("verl_ext", good, 2) == []
    write_records(tmp_path / "b.jsonl", [(2, 1, 0)])  # a screenshot that never reached the record
    refused = script.summarize({1: {"tito/engine/image_prompt_refused": 1.0}}, script.rollout_shapes(tmp_path))
    problems = script.turn_problems("verl_ext_vl", refused, 2)
    assert any("1 rollouts have no image" in p for p in problems)
    assert any("1 image prompts refused by the server" in p for p in problems)
    assert script.turn_problems("verl_ext", refused, 2) == []  # the text arms have no image to miss
