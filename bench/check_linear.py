"""The check's cost per turn where every turn draws an allowed finding: at 1,000 turns against one render + encode,
and its growth from 100 to 1,000 turns (the check linear in turns whatever it finds).

Each rollout is a tool-calling conversation on a shipped tokenizer whose turns are written as the template writes
them, reasoning blocks included: every assistant turn sampled as the template renders that message as the last one
(tests/long_rollouts.py ``templated_tool_rollout``), so the template's history form of it differs in every turn by
a finding the check allows. The variants (``VARIANTS``), by what each turn draws:

- ``empty think block`` (Qwen3, thinking on): each turn opens with ``<think>\\n\\n</think>\\n\\n``, which the template
  drops from history: one ``reasoning_stripped`` per turn;
- ``thinking off`` (Qwen3, ``enable_thinking=False``): the generation prompt pre-fills the empty block, which the
  template drops from history: one pre-fill finding per turn;
- ``thinking + compact calls`` (Qwen3, thinking on): each turn thinks, then writes its call's JSON without spaces,
  which the template re-serializes with them (``tool_call_reserialized``);
- ``analysis each turn`` (GPT-OSS): each call turn writes its analysis channel first; the template drops it from every
  turn once the final answer follows (``reasoning_stripped``);
- ``think block + compact calls`` (Qwen3, thinking on): the empty block and the compact JSON both;
- ``compact calls`` (every other template): the call's JSON without spaces (``tool_call_reserialized``);
- ``user turns, thinking`` (Qwen3): each turn thinks and answers, then the next question comes; the template drops
  the thinking of every answered turn (``reasoning_stripped``);
- ``user turns (tool list moved)`` (Mistral): the template writes its tool list before the last question only; every
  prompt the engine saw had it before its own last question (``context_moved``).

Tool results are JSON lines of about ``--result-tokens`` tokens (150: bench/long_horizon.py's smaller size; 8
distinct ones, cycled). Every rollout ends on the assistant's answer, and is recorded as the loop records it (the
``EngineCalls`` log, the ``Rollout`` with the trajectory's kinds). Per rollout, in the same run, fastest of
``--reps`` each: the whole check (engine view, turn ends, template view; no time budget) and one transformers render
+ encode of the final conversation (``apply_chat_template(messages, tools=..., tokenize=True)``, with the template's
kwargs). Printed: check / render at 1,000 turns (goal at most 1.0x) and the check's cost per turn at 1,000 turns
over its cost per turn at 100 (goal at most 1.25x). Ratios, never asserted timings; the machine and its load are
printed.

    PYTHONPATH=. .venv/bin/python bench/check_linear.py [--turns 100 1000] [--reps 2] [--tokenizers qwen3,...]
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")  # verl's PPO runtime env sets it so

sys.path.insert(0, str(REPO / "tests"))
from _timing import fastest  # noqa: E402
from long_rollouts import templated_tool_rollout  # noqa: E402
from rollouts import TOOLS  # noqa: E402

RATIO_GOAL, GROWTH_GOAL = 1.0, 1.25
POOL = 8  # distinct tool results, cycled


@dataclass(frozen=True)
class Variant:
    """How a rollout's turns are written: the template's kwargs, what each assistant message holds besides its call,
    and whether the engine wrote the call's JSON without spaces."""

    tokenizer: str
    name: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)  # added to every call turn's message
    compact: bool = False
    answer_extra: bool = True  # the answer carries ``extra`` too (GPT-OSS: its thinking is for call turns here)
    user_turns: bool = False  # each turn an answer and the next question, not a call and its result


VARIANTS = (
    Variant("qwen3", "empty think block", extra={"reasoning_content": ""}),
    Variant("qwen3", "thinking off", kwargs={"enable_thinking": False}),
    Variant("qwen3", "thinking + compact calls", extra={"reasoning_content": "Let me look it up."}, compact=True),
    Variant("qwen3", "think block + compact calls", compact=True),
    Variant("qwen3", "user turns, thinking", extra={"reasoning_content": "Let me add."}, user_turns=True),
    Variant("qwen2.5", "compact calls", compact=True),
    Variant("gpt-oss", "analysis each turn", extra={"thinking": "Let me look it up."}, answer_extra=False),
    Variant("gpt-oss", "compact calls", compact=True),
    Variant("mistral-7b-v0.3", "compact calls", compact=True),
    Variant("mistral-7b-v0.3", "user turns (tool list moved)", user_turns=True),
)


def load_note() -> str:
    """The machine, its load now and the tokenizers' parallelism setting (other processes share the machine)."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    parallel = os.environ.get("TOKENIZERS_PARALLELISM", "(unset)")
    return f"{platform.machine()}, {os.cpu_count()} CPUs, load average {load}, TOKENIZERS_PARALLELISM={parallel}"


def results(renderer: Any, size: int) -> list[str]:
    """``POOL`` distinct tool results of about ``size`` tokens (JSON lines, as bench/turns.py writes them)."""
    from turns import tool_output

    rng = random.Random(size)
    return [tool_output(renderer.tokenizer, size, rng) for _ in range(POOL)]


@dataclass
class Row:
    variant: Variant
    turns: int
    tokens: int
    check_s: float
    render_s: float
    findings: str


def measure(
    renderer: Any, profile: Any, v: Variant, turns: int, reps: int, deltas: Any, pool: Sequence[str], clock: int = 0
) -> Row:
    """One rollout: its check and one render + encode of its messages, taking turns, fastest of ``reps`` each
    (``clock``: 0 wall time, 1 process CPU time)."""
    from verl_ext.check import CheckPolicy, ConsistencyChecker

    rollout = templated_tool_rollout(
        renderer,
        profile,
        turns,
        extra=v.extra,
        compact=v.compact,
        answer_extra=v.answer_extra,
        results=pool,
        deltas=deltas,
        user_turns=v.user_turns,
    )
    first = rollout()
    messages, stream = first.messages, first.sample.stream
    checker = ConsistencyChecker(renderer, profile, policy=CheckPolicy(template_view_budget_s=None))
    checked: list[Any] = []
    hf = {"tools": TOOLS, "tokenize": True, **v.kwargs}
    best = fastest(
        {
            "check": lambda: checked.append(checker.check_rollout(rollout(), template_view=True)),
            "render": lambda: renderer.tokenizer.apply_chat_template([dict(m) for m in messages], **hf),
        },
        reps,
        freeze=True,
    )
    result = checked[-1]
    if not result.ok:
        raise SystemExit(f"{v.tokenizer} {v.name}: the check found defects in a benchmark rollout: {result.summary()}")
    counts = result.cause_counts()
    if sum(counts.values()) < turns:
        raise SystemExit(f"{v.tokenizer} {v.name}: fewer findings than turns ({dict(counts)}): not the case measured")
    causes = ", ".join(f"{c}×{n}" for c, n in sorted(counts.items()))
    return Row(v, turns, len(stream), best["check"][clock], best["render"][clock], causes)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--turns", type=int, nargs=2, default=[100, 1000], metavar=("FEW", "MANY"))
    p.add_argument("--reps", type=int, default=2, help="timed runs of each; the fastest is kept")
    p.add_argument("--tokenizers", default="qwen3,qwen2.5,gpt-oss,mistral-7b-v0.3")
    p.add_argument("--only", default="", help="only the variants whose name holds this text")
    p.add_argument("--result-tokens", type=int, default=150, help="tokens per tool result (bench/long_horizon.py's)")
    p.add_argument(
        "--cpu",
        action="store_true",
        help="compare process CPU time (every thread), not wall time: on a shared, loaded machine wall time is mostly "
        "the other processes' (set TOKENIZERS_PARALLELISM=false for one thread's)",
    )
    args = p.parse_args(argv)
    few, many = args.turns

    from verl_ext.core.learned_deltas import LearnedDeltas
    from verl_ext.core.probe import probe_template
    from verl_ext.core.rendering import load_renderer
    from verl_ext.demo.run import shipped_tokenizers

    print(f"machine: {load_note()}; clock: {'process CPU time' if args.cpu else 'wall time'}", flush=True)
    folders = shipped_tokenizers()
    wanted = args.tokenizers.split(",")
    chosen = [v for v in VARIANTS if v.tokenizer in wanted and args.only in v.name]
    lines: list[str] = []
    missed = 0
    for n, v in enumerate(chosen, 1):
        renderer = load_renderer(folders[v.tokenizer]).with_template_kwargs(dict(v.kwargs))
        profile = probe_template(renderer)
        deltas = LearnedDeltas(renderer, profile)
        pool = results(renderer, args.result_tokens)
        rows = []
        for turns in (few, many):
            print(f"[{n}/{len(chosen)}] {v.tokenizer} {v.name}: {turns} turns ...", flush=True)
            rows.append(measure(renderer, profile, v, turns, args.reps, deltas, pool, int(args.cpu)))
        small, big = rows
        ratio = big.check_s / big.render_s
        growth = (big.check_s / big.turns) / (small.check_s / small.turns)
        missed += (ratio > RATIO_GOAL) + (growth > GROWTH_GOAL)
        lines.append(
            f"{v.tokenizer:<16} {v.name:<28} {big.tokens:>8} {big.check_s:>8.2f} {big.render_s:>8.2f} "
            f"{ratio:>6.2f}x {'PASS' if ratio <= RATIO_GOAL else 'FAIL'} "
            f"{small.check_s / small.turns * 1e3:>8.2f} {big.check_s / big.turns * 1e3:>8.2f} "
            f"{growth:>6.2f}x {'PASS' if growth <= GROWTH_GOAL else 'FAIL'}  {big.findings}"
        )
        print("    " + lines[-1], flush=True)
    print()
    print(f"machine at the end: {load_note()}")
    print(
        f"at {many} turns: check s, one transformers render + encode s, their ratio (goal <= {RATIO_GOAL}x); "
        f"check ms per turn at {few} and {many} turns, their ratio (goal <= {GROWTH_GOAL}x); findings at {many}"
    )
    print(
        f"{'tokenizer':<16} {'variant':<28} {'tokens':>8} {'check':>8} {'render':>8} {'ratio':>7} {'':4} "
        f"{'ms/t few':>8} {'ms/t many':>8} {'growth':>7}"
    )
    print("\n".join(lines))
    print("all goals met" if not missed else f"{missed} goal(s) missed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
