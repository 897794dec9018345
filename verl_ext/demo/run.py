"""``verl-ext demo``: verl's real GRPO trainer on CPU, with verl_ext's loop, check, metrics and report.

Steps: unpack the real Qwen3 tokenizer shipped with the repository, build a tiny random Qwen3-architecture model and
an arithmetic tool-calling dataset, run ``python -m verl.trainer.main_ppo`` with the job config configs/cpu_demo.yaml
(Ray, FSDP2 on gloo, the ``verl_ext_cpu`` engine), print progress and each step's ``tito/`` metrics, then write the
HTML report from the rollout records. Everything lands in ``--out`` (default build/demo); the trainer's full log is
train.log.

``loop="gateway"`` (``verl-ext demo --loop gateway``) runs the same job with verl_ext's ``gateway`` preset:
``verl_ext_gateway_agent`` runs the demo's harness (verl_ext/demo/harness.py, a ReAct calculator agent on the openai
SDK) once per row through the token-keeping gateway, instead of verl_ext_tool_agent's own loop (``GATEWAY_OVERRIDES``).

A random model never calls a tool, so the demo sets the CPU engine's TEST/DEMO-ONLY hook that teacher-forces a
calculator call as every trajectory's first assistant turn (its logprobs are still the model's); later turns are
sampled. Never use that hook in a real run.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_ext.core.errors import MissingFileError, OptionsError
from verl_ext.engines.forced_turn import FORCED_SCREENSHOT_CALL, FORCED_TOOL_CALL

REPO = Path(__file__).resolve().parents[2]
# what a person wants to see per step; every tito/ metric is printed too
STEP_METRICS = (
    ("critic/rewards/mean", "reward"),
    ("actor/grad_norm", "grad_norm"),
    # verl's figure is a difference of probabilities (exp applied to both logprobs first), batch-wide
    ("training/rollout_probs_diff_max", "rollout-vs-trainer prob diff (max)"),
    ("num_turns/mean", "turns"),
)
_NUMBER = re.compile(r"^(?:np\.\w+\()?([-+]?(?:[0-9.]+(?:[eE][-+]?[0-9]+)?|nan|inf))\)?$")
NUMERICS = "tito/numerics/"
# the demo's bypass mode: verl skips the old-logprob pass and trains against the rollout's logprobs; the numbers are
# then measured inside the policy loss (verl_ext.plugin.numerics_loss)
BYPASS_OVERRIDES = ("algorithm.rollout_correction.bypass_mode=true",)
_STEP_LINE = re.compile(r"step:(\d+) - ")  # after Ray's "(TaskRunner pid=...)" prefix, if any
JOB_CONFIGS = REPO / "configs"  # the user-facing job configs (the verl_ext option group stays in the package)
DEMO_HARNESS = "verl_ext.demo.harness:run"
# the demo job with the gateway preset and the demo's harness: verl_ext_gateway_agent instead of verl_ext_tool_agent
GATEWAY_OVERRIDES = ("verl_ext=gateway", f"verl_ext.harness.function={DEMO_HARNESS}")
LOOPS = {  # --loop -> the agent loops that run
    "tool": "verl_ext_tool_agent",
    "gateway": "verl_ext_gateway_agent",
    "all": "verl_ext_tool_agent, verl_ext_audited_tool_agent and verl_ext_gateway_agent (rows name them: agent_name)",
}
ALL_LOOPS = ("verl_ext_tool_agent", "verl_ext_audited_tool_agent", "verl_ext_gateway_agent")  # --loop all, by row
TRAINERS = {  # --trainer -> verl's trainer, as the demo names it (v1's default mode is trainer.v1.trainer_mode=sync)
    "v1": "verl's v1 trainer",
    "v0": "verl's v0 trainer",
    "colocate-async": "verl's v1 trainer in colocate_async mode (trainer.v1.trainer_mode=colocate_async: partial "
    "rollouts)",
}
PARK_TOKENS = 4  # colocate-async: one request per weight version is parked after this many sampled ids
TRUTH_LOG = "engine-truth.jsonl"  # colocate-async: the CPU engine's log of which version generated which ids
# --model -> what a person is told it is
MODELS = {
    "qwen3": "a tiny random Qwen3 model with the calculator tool",
    "qwen2.5-vl": "a tiny random Qwen2.5-VL model with the screenshot tool, an image in every prompt and tool result",
}
# The VL job's settings on top of cpu_demo.yaml:
# - trust_remote_code: verl builds the processor with AutoProcessor, which needs torchvision for Qwen2.5-VL; the tiny
#   model's folder names a remote-code processor that builds it without (verl_ext/demo/vl_processing.py);
# - no remove-padding: verl's packed-sequence attention for Qwen2-VL models is flash-attention only (a GPU kernel).
VL_OVERRIDES = (
    "actor_rollout_ref.model.trust_remote_code=true",
    "data.trust_remote_code=true",
    "actor_rollout_ref.model.use_remove_padding=false",
)


@dataclass
class DemoResult:
    returncode: int
    out: Path
    log: Path
    steps: dict[int, dict[str, float]] = field(default_factory=dict)
    report: Path | None = None
    seconds: float = 0.0


def parse_step_line(line: str) -> tuple[int, dict[str, float]] | None:
    """verl's console logger line ``step:N - key:value - ...`` as (N, metrics)."""
    match = _STEP_LINE.search(line)
    if not match:
        return None
    metrics: dict[str, float] = {}
    for part in line[match.start() :].rstrip("\n").split(" - ")[1:]:
        key, _, value = part.rpartition(":")
        number = _NUMBER.match(value.strip())  # numpy scalars print as np.float64(0.5)
        if number:
            metrics[key] = float(number.group(1))
    return int(match.group(1)), metrics


def format_step(step: int, total: int, metrics: dict[str, float]) -> str:
    head = [f"step {step}/{total}"]
    head += [f"{label} {metrics[key]:.4g}" for key, label in STEP_METRICS if key in metrics]
    tito = {k: v for k, v in metrics.items() if k.startswith("tito/") and not k.startswith(NUMERICS)}
    lines = ["  ".join(head)]
    if not tito:
        lines.append("    (no tito/ metrics: the verl_ext loop did not run in this step)")
    lines.append(format_numerics(metrics))
    counts = [
        f"{k.removeprefix('tito/')} {v:g}" for k, v in sorted(tito.items()) if v or "/" not in k.removeprefix("tito/")
    ]
    for i in range(0, len(counts), 4):
        lines.append("    " + "   ".join(counts[i : i + 4]))
    return "\n".join(lines)


def format_numerics(metrics: dict[str, float]) -> str:
    """The step's ``numerics`` line from its ``tito/numerics/`` metrics: the trainer's logprob of each sampled token
    minus the engine's (Δ), overall, per depth bucket and per turn that had tokens."""
    m = {k.removeprefix(NUMERICS): v for k, v in metrics.items() if k.startswith(NUMERICS)}
    if not m:
        return "    numerics: none (no tito/numerics/ metrics in this step)"
    head = (
        f"    numerics: {m.get('rollouts', 0):g} rollouts, {m.get('numerics_unavailable', 0):g} unavailable, "
        f"{m.get('drift_rollouts', 0):g} drift; |Δ| mean {m.get('mean_abs_delta', 0):.3g} max "
        f"{m.get('max_abs_delta', 0):.3g}, k3 {m.get('k3', 0):.3g}"
    )
    groups = []
    for kind in ("depth", "turn"):
        cells = [
            f"{key.split('/')[1]} {m[key]:.3g}"
            for key in sorted(m, key=_bucket_order)
            if key.startswith(f"{kind}/")
            and key.endswith("/mean_abs_delta")
            and m.get(key.replace("mean_abs_delta", "tokens"), 0)
        ]
        if cells:
            groups.append(f"by {kind}: " + ", ".join(cells))
    return "; ".join([head, *groups])


def _bucket_order(key: str) -> tuple[str, int]:
    """``depth/512-1024/...`` and ``turn/3/...`` in numeric order of their first number."""
    kind, _, rest = key.partition("/")
    digits = re.match(r"\d+", rest)
    return kind, int(digits.group()) if digits else -1


def shipped_tokenizers() -> dict[str, Path]:
    """Unpack the real tokenizers shipped with the repository (tests/fixtures) if needed; name -> folder."""
    script = REPO / "scripts" / "unpack_tokenizers.py"
    if not script.is_file():
        raise MissingFileError(
            f"{script} is missing: `verl-ext demo` runs from a clone of the verl_ext repository (it uses the Qwen3 "
            "tokenizer shipped under tests/fixtures)"
        )
    spec = importlib.util.spec_from_file_location("_verl_ext_unpack_tokenizers", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.ensure_unpacked()


def shown(path: Path) -> Path:
    """``path`` as a person typed it: relative to the working folder when it lies inside it (build/demo/report.html),
    else as it is."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def prepare(out: Path, say: Callable[[str], None], model: str = "qwen3", loop: str = "tool") -> dict[str, Path]:
    """The demo's model folder and dataset in ``out`` (built once; kept between runs); ``loop="all"``: each row names
    one of ``ALL_LOOPS`` in turn (``agent_name``)."""
    from verl_ext.demo.data import make_rows, make_screen_rows, rows_naming, write_dataset

    out.mkdir(parents=True, exist_ok=True)
    if model == "qwen2.5-vl":
        folder = out / "tiny-qwen2.5-vl"
        if not (folder / "config.json").is_file():
            from verl_ext.demo.vl_model import save_tiny_vl_model  # torch and transformers: only when missing

            save_tiny_vl_model(folder, shipped_tokenizers()["qwen2.5"])
        data = write_dataset(out / "data-vl", rows=make_screen_rows)
        say(
            f"prepared a tiny random Qwen2.5-VL model ({shown(folder)}) with the real Qwen2.5 tokenizer and the VL "
            "template, and the screen dataset (an icon image per prompt)"
        )
        return {"model": folder, "train": data["train"], "val": data["val"]}
    tokenizer = shipped_tokenizers()["qwen3"]
    folder = out / "tiny-qwen3"
    if not (folder / "config.json").is_file():
        from verl_ext.demo.model import build_tiny_qwen3  # torch and transformers: only when the model is missing

        build_tiny_qwen3(folder, tokenizer, seed=0)
    if loop == "all":
        data = write_dataset(out / "data-all", rows=rows_naming(make_rows, ALL_LOOPS))
    else:
        data = write_dataset(out / "data")
    say(
        f"prepared a tiny random Qwen3 model ({shown(folder)}) with the real Qwen3 tokenizer, and the calculator "
        "dataset"
    )
    return {"model": folder, "train": data["train"], "val": data["val"]}


def trainer_command(
    paths: dict[str, Path],
    out: Path,
    steps: int,
    trainer: str,
    extra: Sequence[str],
    loop: str = "tool",
    model: str = "qwen3",
    bypass: bool = False,
) -> list[str]:
    """verl's trainer on the demo's job config, with the paths ``prepare`` made (and, for ``loop="gateway"``, the
    gateway preset with the demo's harness; for ``model="qwen2.5-vl"``, the screenshot tool and ``VL_OVERRIDES``;
    with ``bypass``, ``BYPASS_OVERRIDES``; ``extra`` comes after, so it can name another). Raises MissingFileError
    outside a clone of the repository (the job config is in its top-level configs/, not in the package)."""
    if not (JOB_CONFIGS / "cpu_demo.yaml").is_file():
        raise MissingFileError(
            f"{JOB_CONFIGS / 'cpu_demo.yaml'} is missing: `verl-ext demo` runs from a clone of the verl_ext "
            "repository (its job config is configs/cpu_demo.yaml)"
        )
    tools = "screenshot_tool.py" if model == "qwen2.5-vl" else "tools.py"
    return [
        sys.executable,
        "-m",
        "verl.trainer.main_ppo",
        f"--config-path={JOB_CONFIGS}",
        "--config-name=cpu_demo",
        f"actor_rollout_ref.model.path={paths['model']}",
        f"data.train_files={paths['train']}",
        f"data.val_files={paths['val']}",
        f"actor_rollout_ref.rollout.multi_turn.function_tool_path={REPO / 'verl_ext' / 'demo' / tools}",
        f"reward.custom_reward_function.path={REPO / 'verl_ext' / 'demo' / 'reward.py'}",
        f"trainer.total_training_steps={steps}",
        f"trainer.use_v1={'false' if trainer == 'v0' else 'true'}",
        f"trainer.default_local_dir={out / 'checkpoints'}",
        f"verl_ext.records.dir={out / 'records'}",
        f"hydra.run.dir={out / 'hydra'}",
        *(GATEWAY_OVERRIDES if loop in ("gateway", "all") else ()),
        # rows in file order: the first batches (the ones trained in the first steps) name every loop
        *(("data.shuffle=false",) if loop == "all" else ()),
        *(async_overrides(out) if trainer == "colocate-async" else ()),
        *(VL_OVERRIDES if model == "qwen2.5-vl" else ()),
        *(BYPASS_OVERRIDES if bypass else ()),
        *extra,
    ]


def async_overrides(out: Path) -> tuple[str, ...]:
    """verl's ``colocate_async`` trainer mode (abort at each sample's end, weight update, resume at the step's end),
    with the CPU engine's ``abort_after`` hook (one request per weight version parked after ``PARK_TOKENS`` sampled ids
    until verl's abort, so every step resumes a turn across a weight update) and its truth log (``TRUTH_LOG``)."""
    from verl_ext.demo.faults import engine_override

    faults = [{"kind": "abort_after", "tokens": PARK_TOKENS}]
    return ("trainer.v1.trainer_mode=colocate_async", engine_override(faults, truth_log=str(out / TRUTH_LOG)))


def counted(n: int, thing: str) -> str:
    """``1 step``, ``2 steps``."""
    return f"{n} {thing}{'' if n == 1 else 's'}"


def check_choices(loop: str, model: str, trainer: str = "v1") -> None:
    """Raise ``OptionsError`` for a ``loop``, ``model`` or ``trainer`` the demo does not have, the VL model with the
    gateway (the demo's harness is the calculator agent), or every loop under v0 (the gateway's rows need v1's
    per-row loop column as the demo writes it)."""
    if trainer not in TRAINERS:
        raise OptionsError(f"the demo's trainer must be one of {sorted(TRAINERS)}, got {trainer!r}")
    if loop == "all" and trainer == "v0":
        raise OptionsError("--loop all runs under verl's v1 trainer: use --trainer v1 or --trainer colocate-async")
    if loop not in LOOPS:
        raise OptionsError(f"the demo's loop must be one of {sorted(LOOPS)}, got {loop!r}")
    if model not in MODELS:
        raise OptionsError(f"the demo's model must be one of {sorted(MODELS)}, got {model!r}")
    if model != "qwen3" and loop != "tool":
        raise OptionsError(
            f"--model {model} runs with --loop tool only: the demo's harness for the gateway is the calculator agent; "
            "pass --loop tool, or leave --model out (qwen3)"
        )


def run_demo(
    out: Path,
    steps: int = 2,
    trainer: str = "v1",
    extra_overrides: Sequence[str] = (),
    say: Callable[[str], None] = print,
    loop: str = "tool",
    model: str = "qwen3",
    bypass: bool = False,
) -> DemoResult:
    """The demo, end to end (module docstring); ``loop`` is ``tool`` (verl_ext_tool_agent) or ``gateway``
    (verl_ext_gateway_agent with the demo's harness); ``model`` one of ``MODELS``; ``bypass``: verl's bypass mode
    (no old-logprob pass; the numbers come from inside the policy loss). Raises ``OptionsError`` for
    another ``loop`` or ``model`` (``check_choices``)."""
    check_choices(loop, model, trainer)
    started = time.monotonic()

    def stamp(message: str) -> None:
        say(f"[{time.monotonic() - started:6.1f}s] {message}")

    out = out.resolve()
    records = out / "records"
    if records.is_dir():  # a fresh report per run: old records would mix two runs
        for old in records.glob("*.jsonl"):
            old.unlink()
    paths = prepare(out, stamp, model, loop)
    log = out / "train.log"
    env = {
        **os.environ,
        "VERL_PLATFORM": "cpu",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "VERL_EXT_CPU_FORCE_FIRST_TURN": os.environ.get(
            "VERL_EXT_CPU_FORCE_FIRST_TURN", FORCED_SCREENSHOT_CALL if model == "qwen2.5-vl" else FORCED_TOOL_CALL
        ),
    }
    command = trainer_command(paths, out, steps, trainer, extra_overrides, loop, model, bypass)
    mode = ", bypass mode" if bypass else ""
    steps_run = counted(steps, "GRPO step")
    stamp(f"starting verl's trainer ({trainer}{mode}, {steps_run}, Ray on CPU); full log: {shown(log)}")
    result = DemoResult(returncode=-1, out=out, log=log)
    with log.open("w", encoding="utf-8") as fh:
        fh.write(" ".join(command) + "\n")
        proc = subprocess.Popen(command, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        last = [time.monotonic()]
        watcher = threading.Thread(target=_heartbeat, args=(proc, last, stamp), daemon=True)
        watcher.start()
        milestones = _Milestones(stamp)
        for line in proc.stdout:
            fh.write(line)
            fh.flush()
            last[0] = time.monotonic()
            milestones.see(line)
            parsed = parse_step_line(line)
            if parsed:
                step, metrics = parsed
                result.steps[step] = metrics
                stamp(format_step(step, steps, metrics))
        result.returncode = proc.wait()
    if result.returncode != 0:
        stamp(f"the trainer failed (exit {result.returncode}); last lines of {shown(log)}:")
        for line in log.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]:
            say("    " + line)
        result.seconds = time.monotonic() - started
        return result
    stamp(f"trainer finished: {counted(len(result.steps), 'step')}")
    result.report = write_report(out, paths["model"], stamp)
    result.seconds = time.monotonic() - started
    return result


def write_report(out: Path, tokenizer_dir: Path, say: Callable[[str], None]) -> Path | None:
    from tokenizers import Tokenizer

    from verl_ext.report import build_report, write_html
    from verl_ext.report.load import load_records

    # named as `verl-ext report build/demo/records/*.jsonl` names them, so both write the same page
    files = [shown(f) for f in sorted((out / "records").glob("*.jsonl"))]
    if not files:
        say("no rollout records were written; no report")
        return None
    # The report only decodes ids for display: the tokenizers library alone, not transformers (seconds to import).
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    report = build_report(
        load_records(files),
        lambda ids: tokenizer.decode(list(ids), skip_special_tokens=False),
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
    )
    path = write_html(out / "report.html", report.html)
    say(f"report: {shown(path)} ({report.summary.one_line()})")
    return path


class _Milestones:
    """Say once when the run passes a stage a person waits for."""

    STAGES = (
        ("verl_ext plugin loaded", "verl_ext plugin loaded (agent loops, CPU engine, CPU platform)"),
        ("Started a local Ray instance", "Ray started"),
        ("verl_ext check ready", "first rollout: verl_ext probed the chat template and armed the check"),
        ("gateway serving on", "the agent-loop worker's gateway is serving; the harness runs each row against it"),
        ("update_weights", "weights synced from the trainer to the CPU rollout server"),
    )

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.seen: set[str] = set()

    def see(self, line: str) -> None:
        for needle, message in self.STAGES:
            if needle not in self.seen and needle in line:
                self.seen.add(needle)
                self.say(message)


def _heartbeat(proc: subprocess.Popen[Any], last: list[float], say: Callable[[str], None], every: float = 20.0) -> None:
    while proc.poll() is None:
        time.sleep(1.0)
        if time.monotonic() - last[0] > every:
            say("... still running (the trainer prints nothing while it starts workers or computes a step)")
            last[0] = time.monotonic()
