"""verl's GRPO trainer on one GPU with the real SGLang engine: verl_ext's server and loop against verl's stock server
and stock tool_agent, one after the other in one run, with the same data, model and seed.

A tiny random Qwen3 model is built locally with the real Qwen3 tokenizer (no download). A random model never calls
the tool, so every trajectory's first assistant turn is forced to a calculator call (the TEST/DEMO hook
``VERL_EXT_SGLANG_FORCE_FIRST_TURN``: SGLang scores the forced ids, the logprobs are the model's); later turns are
sampled. Every rollout then has at least two engine calls and a tool result, which ``--min-turns 2`` asserts.

    python tests/gpu/run_sglang_grpo.py --out build/gpu [--steps 3] [--min-turns 2] [--model DIR] [--dry-run]
                                        [--arms verl_ext stock verl_ext_vl]

The VL arm (``verl_ext_vl``, not in the default arms) runs verl_ext's loop and SGLang server on a tiny random
Qwen2.5-VL (the real Qwen2.5 tokenizer with the VL template and processor settings of tests/fixtures/vl) with the
screenshot tool (verl_ext/demo/screenshot_tool.py): the forced first turn asks for a screenshot, so every rollout's
second engine call carries an image through the server's image path (SGLang's rebuild of the ids proven before
sending, placeholders banned). It needs torchvision on the node (verl builds the processor with AutoProcessor, and
SGLang's Qwen-VL processor imports it). It also fails on a rollout without an image, and on any image prompt the
server refused (``tito/engine/image_prompt_refused``).

``--dry-run`` does everything up to the GPU and stops: the model folder and its tokenizer, the dataset against the
batch size, each arm's trainer command composed with verl's own Hydra config, the server class each arm's replica
will launch and the forced turn tokenized with the model's tokenizer (the CPU test runs it).

The stock arm runs verl's ``tool_agent`` unchanged under verl_ext's audit loop (``verl_ext_audited_tool_agent``: the
tokens trained are the stock loop's, the check only watches), with verl's own SGLang server, so both arms report the
same figures. Printed per arm: engine-view failures, template-view defects, ``training/rollout_probs_diff_max`` and
its mean, assistant turns and engine calls per rollout, tool calls, generation seconds per step and response tokens
per second (step 1, which compiles, left out), and the verl_ext/stock ratios for throughput and step time. Writes
``summary.json``. Exit 1 when verl_ext's arm has an engine-view failure or a rollout has fewer turns than asked.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from verl_ext.demo.run import parse_step_line, shipped_tokenizers  # noqa: E402
from verl_ext.engines.forced_turn import FORCED_TOOL_CALL, SGLANG_FORCE_ENV  # noqa: E402

# the VL arm's forced first turn: a screenshot call (a 112x56 image comes back), closed as a turn the model ended
FORCED_SCREENSHOT_CALL = '<tool_call>\n{"name": "screenshot", "arguments": {"region": "top"}}\n</tool_call><|im_end|>'
from verl_ext.engines.sglang_output import SWITCH_ENV  # noqa: E402

TRAIN_BATCH = 16  # data.train_batch_size: prompts per step
ROLLOUT_N = 4  # rollouts per prompt
ROLLOUTS_PER_STEP = TRAIN_BATCH * ROLLOUT_N


@dataclass(frozen=True)
class Arm:
    """One side of the comparison: the agent loop, whether verl_ext's SGLang server replaces verl's, and whether
    it runs the VL model with the screenshot tool."""

    loop: str
    verl_ext_server: bool
    vl: bool = False

    @property
    def forced_turn(self) -> str:
        return FORCED_SCREENSHOT_CALL if self.vl else FORCED_TOOL_CALL

    @property
    def tool_path(self) -> Path:
        return REPO / "verl_ext" / "demo" / ("screenshot_tool.py" if self.vl else "tools.py")


ARMS = {
    "verl_ext": Arm(loop="verl_ext_tool_agent", verl_ext_server=True),
    "stock": Arm(loop="verl_ext_audited_tool_agent", verl_ext_server=False),
    "verl_ext_vl": Arm(loop="verl_ext_tool_agent", verl_ext_server=True, vl=True),
}
DEFAULT_ARMS = ("verl_ext", "stock")  # the VL arm needs torchvision on the node: asked for by name

# What one GPU node with the offline bundle (scripts/gpu/) runs with: each override and why it is needed.
GPU_OVERRIDES: tuple[tuple[str, str], ...] = (
    ("+actor_rollout_ref.model.override_config.attn_implementation=sdpa", "flash-attn is in no install path"),
    ("+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=triton", "FA3 is trimmed from sglang-kernel"),
    ("+actor_rollout_ref.rollout.engine_kwargs.sglang.sampling_backend=pytorch", "no flashinfer sampling kernels"),
    ("+actor_rollout_ref.rollout.engine_kwargs.sglang.grammar_backend=none", "xgrammar is not installed"),
    ("+actor_rollout_ref.rollout.engine_kwargs.sglang.disable_piecewise_cuda_graph=true", "not built for this path"),
    ("actor_rollout_ref.rollout.enforce_eager=true", "no CUDA graph capture: a tiny model, fewer moving parts"),
    ("actor_rollout_ref.actor.fsdp_config.use_torch_compile=false", "no Inductor compile on the node"),
    ("data.dataloader_num_workers=0", "the dataset is tiny; no worker processes"),
    ("ray_kwargs.ray_init.num_cpus=64", "TransferQueue and the pools each ask Ray for CPUs"),
    ("+ray_kwargs.ray_init.include_dashboard=false", "the dashboard build is trimmed from the Ray wheel"),
)
# The VL arm's additions, each with its reason (by reading SGLang 0.5.12 and verl 0.9.1; not yet run on a GPU).
VL_OVERRIDES: tuple[tuple[str, str], ...] = (
    (
        "+actor_rollout_ref.rollout.engine_kwargs.sglang.mm_attention_backend=sdpa",
        "SGLang's vision tower defaults to FA3 on Hopper (layers/attention/vision.py), trimmed from sglang-kernel",
    ),
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The script's options; ``--steps`` and ``--min-turns`` must be positive."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "build" / "gpu", help="output folder")
    parser.add_argument("--steps", type=int, default=3, help="GRPO steps per arm (step 1 compiles; >= 2 to time)")
    parser.add_argument("--model", type=Path, default=None, help="a local model folder (default: tiny random Qwen3)")
    parser.add_argument("--min-turns", type=int, default=2, help="assistant turns every rollout must have")
    parser.add_argument("--seed", type=int, default=0, help="data, model and sampling seed (both arms)")
    parser.add_argument(
        "--arms", nargs="+", choices=sorted(ARMS), default=list(DEFAULT_ARMS), help="arms to run, in order"
    )
    parser.add_argument("--dry-run", action="store_true", help="check everything up to the GPU, then stop")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.min_turns < 1:
        parser.error("--steps and --min-turns must be at least 1")
    if args.model is not None and not (args.model / "config.json").is_file():
        parser.error(f"--model {args.model}: no config.json there (a local Hugging Face model folder is needed)")
    return args


def prepare(
    out: Path, model: Path | None, steps: int, seed: int, arms: Sequence[str] = DEFAULT_ARMS
) -> dict[str, Path]:
    """The model folder (a tiny random Qwen3 with the shipped Qwen3 tokenizer unless ``model`` is given), the VL
    arm's (a tiny random Qwen2.5-VL with the shipped Qwen2.5 tokenizer, the VL template and processor settings;
    ``vl_model``, only when that arm runs) and a dataset with a full batch of fresh prompts for every step (verl
    drops an incomplete batch)."""
    from verl_ext.demo.data import write_dataset

    out.mkdir(parents=True, exist_ok=True)
    if model is None:
        model = out / "tiny-qwen3"
        if not (model / "config.json").is_file():
            from verl_ext.demo.model import build_tiny_qwen3

            build_tiny_qwen3(model, shipped_tokenizers()["qwen3"], seed=seed)
    data = write_dataset(out / "data", n_train=TRAIN_BATCH * steps, n_val=2, seed=seed)
    paths = {"model": model, "train": data["train"], "val": data["val"]}
    if any(ARMS[name].vl for name in arms):
        vl_model = out / "tiny-vl"
        if not (vl_model / "config.json").is_file():
            from verl_ext.demo.vl_model import save_tiny_vl_model

            save_tiny_vl_model(vl_model, shipped_tokenizers()["qwen2.5"])
        paths["vl_model"] = vl_model
    return paths


def model_of(paths: dict[str, Path], arm: Arm) -> Path:
    """The model folder an arm trains."""
    return paths["vl_model"] if arm.vl else paths["model"]


def command(paths: dict[str, Path], out: Path, steps: int, arm: Arm, seed: int) -> list[str]:
    """``python -m verl.trainer.main_ppo`` with the run's overrides (the same for every arm but the loop, and the
    VL arm's model and tool)."""
    loop = arm.loop
    return [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=false",
        f"data.train_files={paths['train']}",
        f"data.val_files={paths['val']}",
        f"data.train_batch_size={TRAIN_BATCH}",
        "data.max_prompt_length=512",
        "data.max_response_length=256",
        f"data.seed={seed}",
        f"actor_rollout_ref.model.path={model_of(paths, arm)}",
        # verl's Qwen2.5-VL remove-padding attention (models/transformers/qwen2_vl.py) needs flash-attn's varlen kernels
        f"actor_rollout_ref.model.use_remove_padding={'false' if arm.vl else 'true'}",
        "actor_rollout_ref.actor.strategy=fsdp2",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={TRAIN_BATCH}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={TRAIN_BATCH}",
        "actor_rollout_ref.actor.use_kl_loss=false",
        "actor_rollout_ref.rollout.name=sglang",
        f"actor_rollout_ref.rollout.n={ROLLOUT_N}",
        f"actor_rollout_ref.rollout.seed={seed}",
        "actor_rollout_ref.rollout.temperature=1.0",  # the forced turn's logprobs are at temperature 1
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.rollout.load_format=auto",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={TRAIN_BATCH}",
        "actor_rollout_ref.rollout.prompt_length=512",
        "actor_rollout_ref.rollout.response_length=256",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
        f"actor_rollout_ref.rollout.multi_turn.function_tool_path={arm.tool_path}",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={loop}",
        "actor_rollout_ref.rollout.agent.num_workers=2",
        f"reward.custom_reward_function.path={REPO / 'verl_ext' / 'demo' / 'reward.py'}",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.logger=[console]",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={out / 'ckpt'}",
        f"+verl_ext.records.dir={out / 'records'}",
        f"hydra.run.dir={out / 'hydra'}",
        *(override for override, _why in GPU_OVERRIDES),
        *(override for override, _why in (VL_OVERRIDES if arm.vl else ())),
    ]


def arm_env(arm: Arm, base: dict[str, str] | None = None) -> dict[str, str]:
    """The trainer's environment for one arm: the server switch, the forced first turn (a screenshot call on the VL
    arm), offline Hugging Face. Ray's workers inherit it (the replica reads the hook where it picks the server
    class)."""
    env = dict(os.environ if base is None else base)
    env.update(
        {
            SWITCH_ENV: "1" if arm.verl_ext_server else "0",
            SGLANG_FORCE_ENV: arm.forced_turn,
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
    )
    return env


def compose(cmd: Sequence[str]) -> Any:
    """The trainer config a command's overrides give, composed with verl's own ppo_trainer.yaml as main_ppo does
    (Hydra refuses a key that does not exist, or a ``+`` on one that does)."""
    import verl.trainer
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    overrides = [o for o in cmd[3:] if not o.startswith("hydra.")]
    with initialize_config_dir(config_dir=str(Path(verl.trainer.__file__).parent / "config"), version_base=None):
        return hydra_compose(config_name="ppo_trainer", overrides=overrides)


def expected_server(arm: Arm) -> str:
    """The server class an arm's replica must launch: the forced first turn on verl_ext's or verl's server."""
    return "ForcedFirstTurnTokenExactSGLangServer" if arm.verl_ext_server else "ForcedFirstTurnStockSGLangServer"


def preflight(paths: dict[str, Path], out: Path, steps: int, seed: int, arms: Sequence[str]) -> list[str]:
    """Check everything the run needs short of a GPU; one line per check. Raises SystemExit naming the problem."""
    import pandas as pd
    from transformers import AutoConfig, AutoTokenizer

    from verl_ext.engines.sglang_output import server_class_name
    from verl_ext.plugin.loop_routing import server_enabled
    from verl_ext.plugin.options import OptionsError
    from verl_ext.plugin.preflight import PreflightError, check_config

    lines = []
    checked: set[Path] = set()
    for name in arms:
        arm = ARMS[name]
        model = model_of(paths, arm)
        if model not in checked:
            checked.add(model)
            tokenizer = AutoTokenizer.from_pretrained(str(model))
            config = AutoConfig.from_pretrained(str(model)).get_text_config()
            force_ids = tokenizer.encode(arm.forced_turn, add_special_tokens=False)
            eos = config.eos_token_id if isinstance(config.eos_token_id, list) else [config.eos_token_id]
            if not force_ids or force_ids[-1] not in eos or "<tool_call>" not in tokenizer.decode(force_ids):
                raise SystemExit(
                    f"the forced turn does not tokenize to a tool call ending in an eos id {eos}: {force_ids}"
                )
            lines.append(f"model {model}: vocab {config.vocab_size}, forced turn {len(force_ids)} ids")
            if arm.vl:
                lines.append(vl_preflight(model))
        cfg = compose(command(paths, out / name, steps, arm, seed))
        batch = int(cfg.data.train_batch_size)
        rows = len(pd.read_parquet(paths["train"]))
        if rows // batch < steps:
            raise SystemExit(
                f"{rows} training rows give {rows // batch} full batches of {batch}; {steps} steps need more"
            )
        try:  # what verl_ext's plugin checks in the driver before Ray starts: its options, the data's agent_name
            lines += [f"{name}: {line}" for line in check_config(cfg)]
        except (OptionsError, PreflightError) as exc:
            raise SystemExit(f"{name}: {exc}") from None
        env = arm_env(arm)
        server = server_class_name(server_enabled(cfg.actor_rollout_ref.rollout, env), env)
        if server != expected_server(arm):
            raise SystemExit(f"{name}: the replica would launch {server}, not {expected_server(arm)}")
        lines.append(
            f"{name}: loop {cfg.actor_rollout_ref.rollout.agent.default_agent_loop}, server {server}, "
            f"{rows // batch} batches of {batch} for {steps} steps"
        )
    return lines


def vl_preflight(model: Path) -> str:
    """The VL arm's image side, as verl_ext's loop will see it: the model folder's processor probed with its chat
    template (placeholder, expansion), and the screenshot the forced call returns expanded by it."""
    from verl_ext.core.images import ImageTokens, probe_vision
    from verl_ext.core.rendering import ChatRenderer
    from verl_ext.demo.screenshot_tool import screen
    from verl_ext.runtime.images import blank_image, load_processor

    loaded = load_processor(model)
    processor = loaded.processor
    profile = probe_vision(ChatRenderer(processor.tokenizer), processor, blank_image)
    tokens = ImageTokens(profile, processor)
    shot = screen("top")
    expanded = tokens.expand(shot)
    return (
        f"vl model {model}: processor {type(processor).__name__} ({loaded.how}), placeholder id "
        f"{profile.placeholder_id}, the forced screenshot ({shot.width}x{shot.height}) -> grid "
        f"{list(expanded.grid)}, {expanded.length} placeholders"
    )


def rollout_shapes(records_dir: Path) -> list[dict[str, int]]:
    """Per rollout record (verl_ext's JSONL records): engine calls, tool calls and tool results."""
    shapes = []
    for path in sorted(records_dir.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            obj = json.loads(line) if line.strip() else {}
            if obj.get("type") != "rollout":
                continue
            messages = obj.get("messages") or []
            shapes.append(
                {
                    "engine_calls": len(obj.get("engine_calls") or []),
                    "tool_calls": sum(len(m.get("tool_calls") or []) for m in messages if m.get("role") == "assistant"),
                    "tool_results": sum(m.get("role") == "tool" for m in messages),
                    "images": len(obj.get("images") or []),
                }
            )
    return shapes


def summarize(steps_seen: dict[int, dict[str, float]], shapes: list[dict[str, int]]) -> dict[str, Any]:
    """An arm's figures: the check's totals over all steps; timings over the steps after the first (it compiles)."""
    timed = [m for s, m in sorted(steps_seen.items()) if s > 1] or list(steps_seen.values())
    gen = sum(m.get("timing_s/gen", 0.0) for m in timed)
    step_time = sum(m.get("timing_s/step", 0.0) for m in timed)
    tokens = sum(m.get("response_length/mean", 0.0) * ROLLOUTS_PER_STEP for m in timed)
    every = list(steps_seen.values())
    diffs_max = [m["training/rollout_probs_diff_max"] for m in every if "training/rollout_probs_diff_max" in m]
    diffs_mean = [m["training/rollout_probs_diff_mean"] for m in every if "training/rollout_probs_diff_mean" in m]
    findings = {}
    for m in every:
        for key, value in m.items():
            if key.startswith("tito/findings/") and value:
                findings[key.removeprefix("tito/findings/")] = (
                    findings.get(key.removeprefix("tito/findings/"), 0) + value
                )
    return {
        "steps": len(steps_seen),
        "rollouts_checked": sum(m.get("tito/rollouts_checked", 0.0) for m in every),
        "engine_view_failures": sum(m.get("tito/engine_view_failures", 0.0) for m in every),
        "template_view_defect_rollouts": sum(m.get("tito/rollouts_with_defects", 0.0) for m in every),
        "template_view_findings": findings,
        "rollout_probs_diff_max": max(diffs_max, default=float("nan")),
        "rollout_probs_diff_mean": sum(diffs_mean) / len(diffs_mean) if diffs_mean else float("nan"),
        "num_turns_mean": sum(m.get("num_turns/mean", 0.0) for m in every) / max(len(every), 1),
        "engine_calls_per_rollout_min": min((s["engine_calls"] for s in shapes), default=0),
        "engine_calls_per_rollout_mean": sum(s["engine_calls"] for s in shapes) / max(len(shapes), 1),
        "rollouts_recorded": len(shapes),
        "tool_calls": sum(s["tool_calls"] for s in shapes),
        "rollouts_without_tool_result": sum(s["tool_results"] == 0 for s in shapes),
        "rollouts_without_image": sum(s.get("images", 0) == 0 for s in shapes),
        "images": sum(s.get("images", 0) for s in shapes),
        "image_prompts_refused": sum(m.get("tito/engine/image_prompt_refused", 0.0) for m in every),
        "timed_steps": len(timed),
        "gen_seconds_per_step": gen / max(len(timed), 1),
        "step_seconds_per_step": step_time / max(len(timed), 1),
        "response_tokens_per_second": tokens / gen if gen else float("nan"),
    }


def turn_problems(name: str, arm: dict[str, Any], min_turns: int) -> list[str]:
    """What breaks ``--min-turns``: a rollout with fewer engine calls, or one without a tool result; on the VL arm
    also a rollout without an image and an image prompt the server refused."""
    problems = []
    if arm["rollouts_recorded"] == 0:
        problems.append(f"{name}: no rollout records were written (is verl_ext's loop on?)")
    elif arm["engine_calls_per_rollout_min"] < min_turns:
        problems.append(f"{name}: a rollout has {arm['engine_calls_per_rollout_min']} engine calls (< {min_turns})")
    if min_turns > 1 and arm["rollouts_without_tool_result"]:
        problems.append(f"{name}: {arm['rollouts_without_tool_result']} rollouts have no tool result")
    if ARMS[name].vl and arm["rollouts_recorded"]:
        if arm["rollouts_without_image"]:
            problems.append(f"{name}: {arm['rollouts_without_image']} rollouts have no image (the screenshot)")
        if arm["image_prompts_refused"]:
            problems.append(f"{name}: {arm['image_prompts_refused']:g} image prompts refused by the server")
    return problems


def run_arm(name: str, paths: dict[str, Path], out: Path, steps: int, seed: int) -> dict[str, Any]:
    """Run one arm's trainer to the end, echoing each step; its summary (``summarize``)."""
    arm = ARMS[name]
    out.mkdir(parents=True, exist_ok=True)
    log = out / "train.log"
    steps_seen: dict[int, dict[str, float]] = {}
    started = time.monotonic()
    with log.open("w", encoding="utf-8") as fh:
        cmd = command(paths, out, steps, arm, seed)
        fh.write(" ".join(cmd) + "\n")
        proc = subprocess.Popen(
            cmd, env=arm_env(arm), cwd=out, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            fh.write(line)
            parsed = parse_step_line(line)
            if parsed:
                steps_seen[parsed[0]] = parsed[1]
                gen = parsed[1].get("timing_s/gen", float("nan"))
                print(f"[{name}] step {parsed[0]}: gen {gen:.2f}s", flush=True)
        rc = proc.wait()
    if rc != 0:
        raise SystemExit(f"{name} arm failed (exit {rc}); see {log}")
    summary = summarize(steps_seen, rollout_shapes(out / "records"))
    summary["wall_seconds"] = time.monotonic() - started
    return summary


def report(summary: dict[str, Any]) -> str:
    """The per-arm table a person reads, and the ratios."""
    rows = (
        ("engine-view failures", "engine_view_failures", "{:g}"),
        ("template-view defect rollouts", "template_view_defect_rollouts", "{:g}"),
        ("rollout_probs_diff_max", "rollout_probs_diff_max", "{:.3g}"),
        ("rollout_probs_diff_mean", "rollout_probs_diff_mean", "{:.3g}"),
        ("turns per rollout (verl num_turns)", "num_turns_mean", "{:.2f}"),
        ("engine calls per rollout (min)", "engine_calls_per_rollout_min", "{:g}"),
        ("tool calls", "tool_calls", "{:g}"),
        ("images", "images", "{:g}"),
        ("generation s per step", "gen_seconds_per_step", "{:.2f}"),
        ("step s per step", "step_seconds_per_step", "{:.2f}"),
        ("response tokens / s", "response_tokens_per_second", "{:.0f}"),
    )
    arms = [a for a in ARMS if a in summary]
    lines = [f"{'':36}" + "".join(f"{a:>14}" for a in arms)]
    for label, key, fmt in rows:
        lines.append(f"{label:36}" + "".join(f"{fmt.format(summary[a][key]):>14}" for a in arms))
    for key in ("throughput_ratio_verl_ext_over_stock", "step_time_ratio_verl_ext_over_stock"):
        if key in summary:
            lines.append(f"{key}: {summary[key]:.3f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = args.out.resolve()
    paths = prepare(out, args.model, args.steps, args.seed, args.arms)
    for line in preflight(paths, out, args.steps, args.seed, args.arms):
        print("preflight:", line, flush=True)
    if args.dry_run:
        return 0
    summary: dict[str, Any] = {}
    for name in args.arms:
        summary[name] = run_arm(name, paths, out / name, args.steps, args.seed)
    if "verl_ext" in summary and "stock" in summary:
        ours, stock = summary["verl_ext"], summary["stock"]
        summary["throughput_ratio_verl_ext_over_stock"] = (
            ours["response_tokens_per_second"] / stock["response_tokens_per_second"]
        )
        summary["step_time_ratio_verl_ext_over_stock"] = ours["step_seconds_per_step"] / stock["step_seconds_per_step"]
    problems = [p for name in args.arms for p in turn_problems(name, summary[name], args.min_turns)]
    for name in args.arms:
        if ARMS[name].verl_ext_server and summary[name].get("engine_view_failures"):
            problems.append(f"{name}: engine-view failures (must be 0)")
    summary["problems"] = problems
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(report(summary))
    for problem in problems:
        print("FAIL:", problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
