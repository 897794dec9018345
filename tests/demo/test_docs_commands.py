"""The docs check: every command in README.md and docs/*.md is run here as written, or listed in ``NOT_RUN`` with the
reason it cannot run in CI. A ``$ command`` line in a fenced block is run in a folder laid out as the repository
after ``make demo`` (``build/demo`` is this session's demo run, ``build/tokenizers`` and ``examples`` the
repository's), and the lines under it are compared with what it prints. A command in a ```` ```bash ```` block is
a command too: run, or listed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")))

pytestmark = [pytest.mark.timeout(1200), pytest.mark.xdist_group("ray")]  # demo beside a worker; Ray group

# Commands that cannot run in CI, each with the reason (and where what it does is tested instead).
NOT_RUN: dict[str, str] = {
    "make demo": "the demo itself: this session's demo run (tests/demo/conftest.py) is `verl-ext demo`, which "
    "`make demo` runs after setting up; its printed lines are compared with the README's below",
    "make test": "the whole suite, this test among it",
    "make tokenizers": "a make target: scripts/unpack_tokenizers.py, which tests/conftest.py runs for every session",
    ".venv/bin/python tests/report/report_rollouts.py build/records": "a minute of building rollouts; the same "
    "builder writes the report tests' records (tests/report/conftest.py), whose report they check",
    "verl-ext demo --trainer v0": "a second demo run (minutes on 2 cores): tests/demo/test_gateway_demo.py runs "
    "the v0 trainer (through the gateway)",
    "verl-ext demo '+actor_rollout_ref.rollout.engine_kwargs.verl_ext_cpu={faults:[{kind:past_depth,depth:300,"
    "shift:-0.5}]}'": "a demo run with a test-only fault (minutes on 2 cores): tests/demo/test_demo_faults.py runs "
    "the demo's trainer with this override (built by verl_ext.demo.faults) and asserts where the view finds it",
    "verl-ext demo --trainer colocate-async --loop all --out build/demo-async": "the async demo run (minutes on 2 "
    "cores): tests/demo/test_async_e2e.py runs it (2 steps, every loop) and checks its records against the engine",
    "verl-ext demo --loop gateway --steps 1": "a demo run through the gateway (minutes on 2 cores): "
    "tests/demo/test_gateway_demo.py runs it (one row x 2 samples)",
    "verl-ext demo --model qwen2.5-vl --steps 1 --out build/demo-vl": "the VL demo run (minutes on 2 cores): "
    "tests/demo/test_vl_demo.py runs it and compares what it prints with docs/vl-models.md's output",
    "verl-ext demo actor_rollout_ref.rollout.agent.default_agent_loop=verl_ext_audited_tool_agent": "a demo run "
    "(minutes on 2 cores); the audited stock loop runs in tests/plugin/",
    "recipes/sglang/install.sh": "installs SGLang and CUDA torch on a GPU node (network, GPU)",
    "ray start --head": "starts a Ray cluster on a real head node",
    ".venv/bin/python bench/cpu_trainer_modes.py --trainer one-step-off --steps 3 --out build/one-step-off": "a "
    "trainer start with two pools (five minutes on 2 cores); tests/engines/test_gloo_checkpoint_ray.py runs its "
    "weight sync, tests/plugin/test_trainer_mode.py its rollout path",
    ".venv/bin/python bench/cpu_trainer_modes.py --trainer fully-async --steps 2 --out build/fully-async": "a "
    "trainer start with two pools (seven minutes on 2 cores); tests/engines/test_gloo_checkpoint_ray.py runs its "
    "weight sync",
    "recipes/cpu_demo/cluster.sh start && recipes/cpu_demo/submit.sh; recipes/cpu_demo/cluster.sh stop": "a two-node "
    "Ray cluster for minutes: tests/recipes/test_ray_cluster_recipe.py runs exactly this",
}

# Kinds of commands that cannot run in CI, by pattern (a command matching one is listed by it), with the reason.
NOT_RUN_KINDS: tuple[tuple[str, str], ...] = (
    (r"^python -m verl\.trainer\.main_ppo \.\.\. ", "`...` stands for the user's own job options"),
    (r" \[--", "a usage synopsis (optional arguments in brackets), not a command line"),
    (r"/shared/", "paths on a cluster's shared storage"),
    (
        r"^python recipes/gsm8k_qwen3_sglang/prepare_data\.py ",
        "needs the GSM8K files; tests/recipes/test_gsm8k_recipe.py runs the script on GSM8K-shaped rows",
    ),
    (r"recipes/gsm8k_qwen3_sglang/submit\.sh$", "`ray job submit` to a GPU cluster"),
    (
        r"recipes/agent_harness/submit\.sh",
        "`ray job submit` of a GRPO run to a Ray cluster: tests/recipes/test_agent_harness_recipe.py checks what it "
        "submits, tests/recipes/test_ray_cluster_recipe.py submits it (a harness the driver refuses), and "
        "tests/demo/test_gateway_demo.py runs the same job without the cluster",
    ),
    (
        r"recipes/async/submit(_cpu)?\.sh",
        "`ray job submit` of an async GRPO run to a Ray cluster: tests/recipes/test_async_recipe.py checks what each "
        "script submits, tests/demo/test_async_e2e.py runs the CPU job's command without the cluster",
    ),
    (
        r"scripts/gpu/|tests/gpu/|^export PYTHONPATH=\$PWD/build/verl_ext_env",
        "a GPU machine's set-up or run (tests/gpu/ runs where a GPU is lent)",
    ),
)


def not_run_reason(line: str) -> str | None:
    """Why ``line`` is not run here (None: it is run)."""
    if line in NOT_RUN:
        return NOT_RUN[line]
    return next((reason for pattern, reason in NOT_RUN_KINDS if re.search(pattern, line)), None)


# Run-dependent parts of a documented output, masked on both sides before comparing: how many findings a run of the
# random model has (the README shows one run's count).
MASKS: tuple[tuple[str, str], ...] = ((r"\b\d+ findings\b", "N findings"),)


@dataclass(frozen=True)
class Command:
    """One documented command: where it is, the command line, and the output shown under it (``$`` lines only)."""

    where: str
    line: str
    shown: tuple[str, ...] | None  # None: a ```bash line, no output shown


def documented_commands() -> list[Command]:
    """Every ``$ ...`` line of a fenced block (with the lines under it up to the next ``$`` line) and every command
    line of a ```bash block (continuation lines joined, ``# ...`` comments dropped), in README.md and docs/*.md."""
    out: list[Command] = []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        for block in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.DOTALL | re.MULTILINE):
            where = f"{path.relative_to(REPO)}:{text[: block.start()].count(chr(10)) + 1}"
            body = block.group(2).splitlines()
            if block.group(1) == "bash":
                out += [Command(where, line, None) for line in _bash_lines(body)]
                continue
            starts = [k for k, line in enumerate(body) if line.startswith("$ ")]
            for k, start in enumerate(starts):
                end = starts[k + 1] if k + 1 < len(starts) else len(body)
                out.append(Command(where, body[start][2:].strip(), tuple(body[start + 1 : end])))
    return out


def _bash_lines(body: list[str]) -> list[str]:
    lines: list[str] = []
    pending = ""
    for raw in body:
        line = re.sub(r"\s+#.*$", "", raw).strip() if not raw.lstrip().startswith("#") else ""
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        line = (pending + line).strip()
        pending = ""
        if line:
            lines.append(line)
    return lines


def test_every_documented_command_is_run_or_listed_with_its_reason() -> None:
    commands = documented_commands()
    assert any(c.line.startswith("verl-ext report ") for c in commands)  # the extraction finds the README's
    unknown = [f"{c.where}: {c.line}" for c in commands if not_run_reason(c.line) is None and c.shown is None]
    assert not unknown, f"commands in ```bash blocks that no test runs (run them, or list them in NOT_RUN): {unknown}"
    stale = set(NOT_RUN) - {c.line for c in commands}
    assert not stale, f"NOT_RUN lists commands the docs no longer have: {sorted(stale)}"


@pytest.fixture(scope="module")
def repo_after_demo(demo_runs: Callable[[str], Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder laid out as the repository after ``make demo``: build/demo is this session's demo run, and
    ``verl-ext`` on PATH is this checkout's."""
    run = demo_runs("v1")
    assert run.result.returncode == 0, "\n".join(run.lines)
    root = tmp_path_factory.mktemp("repo-after-demo")
    (root / "build").mkdir()
    (root / "build" / "demo").symlink_to(run.result.out)
    (root / "build" / "tokenizers").symlink_to(REPO / "build" / "tokenizers")
    (root / "examples").symlink_to(REPO / "examples")
    (root / "bin").mkdir()
    for name, run_as in (("verl-ext", f"{sys.executable} -m verl_ext.cli.main"), ("python", sys.executable)):
        shim = root / "bin" / name  # a script, not a link: a linked interpreter would not find its environment
        shim.write_text(f'#!/bin/sh\nexec {run_as} "$@"\n')
        shim.chmod(0o755)
    return root


def run_documented(root: Path, line: str) -> subprocess.CompletedProcess[str]:
    """``line`` through the shell (globs expand as for a user), in ``root``, this checkout's code first."""
    env = {
        **os.environ,
        "PATH": f"{root / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "HF_HUB_OFFLINE": "1",
        "COLUMNS": "120",
    }
    return subprocess.run(
        ["bash", "-c", line], cwd=root, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def _masked(lines: list[str] | tuple[str, ...]) -> list[str]:
    out = []
    for line in lines:
        for pattern, replacement in MASKS:
            line = re.sub(pattern, replacement, line)
        out.append(line.rstrip())
    while out and not out[-1]:
        out.pop()
    return out


RUN = [c for c in documented_commands() if c.shown is not None and not_run_reason(c.line) is None]


@pytest.mark.parametrize("command", RUN, ids=[f"{c.where} {c.line}" for c in RUN])
def test_a_documented_command_prints_what_the_docs_show(command: Command, repo_after_demo: Path) -> None:
    proc = run_documented(repo_after_demo, command.line)
    got = _masked((proc.stdout + proc.stderr).splitlines())
    shown = _masked(command.shown or ())
    if "..." in shown:  # "..." stands for lines left out: those before it start the output, those after it end it
        head, tail = shown[: shown.index("...")], shown[shown.index("...") + 1 :]
        ok = got[: len(head)] == head and (not tail or got[-len(tail) :] == tail)
        ok = ok and len(got) >= len(head) + len(tail)
        assert ok, f"{command.where}: `{command.line}` printed:\n" + "\n".join(got)
    else:
        assert got == shown, f"{command.where}: `{command.line}` printed:\n" + "\n".join(got)
    assert "Traceback" not in proc.stderr


def test_the_readme_report_command_writes_the_demos_report(
    repo_after_demo: Path, demo_runs: Callable[[str], Any]
) -> None:
    """`verl-ext report build/demo/records/*.jsonl -o report.html`, exactly as the README has it (no --tokenizer:
    the header names the tokenizer): exit 0, and the page is the one the demo wrote (the README's picture), the
    demo's folder aside (this run's is a temporary folder, not build/demo)."""
    (command,) = [c for c in documented_commands() if c.where.startswith("README.md") and "report build" in c.line]
    assert command.line == "verl-ext report build/demo/records/*.jsonl -o report.html"
    proc = run_documented(repo_after_demo, command.line)
    assert proc.returncode == 0, proc.stderr
    out = str(demo_runs("v1").result.out)
    written = (repo_after_demo / "report.html").read_text(encoding="utf-8").replace(out, "build/demo")
    demo = (repo_after_demo / "build" / "demo" / "report.html").read_text(encoding="utf-8").replace(out, "build/demo")
    assert written == demo


def printed_lines(messages: tuple[str, ...] | list[str], out: str, shown_as: str) -> list[str]:
    """A demo run's messages as the lines a person saw, its folder ``out`` named ``shown_as`` (a step's line and its
    tito/ metrics are one message of the run, printed as several lines)."""
    return [line.replace(out, shown_as) for message in messages for line in message.split("\n")]


def demo_output_shape(lines: list[str] | tuple[str, ...]) -> list[str]:
    """A demo's printed lines with every number masked, the step's tito/ metric lines (indented: which metrics a
    step logs depends on what it found) and heartbeats left out: what a documented run and this run share."""
    kept = [line for line in lines if line.strip() and not line.startswith("    ")]
    masked = [re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "#", line) for line in kept if "still running" not in line]
    return [" ".join(line.replace("[", "[ ").split()).replace("[ ", "[") for line in masked]


def test_the_readme_demo_output_is_what_the_demo_prints(demo_runs: Callable[[str], Any]) -> None:
    """The README's `make demo` output is one run's: the same lines in the same order, timings and the run's
    numbers aside (each number masked), the demo's folder named build/demo."""
    (command,) = [c for c in documented_commands() if c.line == "make demo" and c.shown is not None]
    run = demo_runs("v1")
    out = str(run.result.out)
    printed = printed_lines(run.lines, out, "build/demo")
    shown = command.shown or ()
    # its first and last lines are the CLI's (verl_ext/cli/demo.py) around the run's own
    assert shown[0].startswith("verl-ext demo: 2 GRPO steps of verl's v1 trainer") and shown[-1].startswith("done in ")
    assert demo_output_shape(shown[1:-1]) == demo_output_shape(printed)
