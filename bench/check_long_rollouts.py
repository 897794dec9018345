"""The consistency check on long and repetitive rollouts (10k to 300k tokens), as a ratio to one render.

For each rollout (real Qwen3 tokenizer and template, built as in tests/long_rollouts.py) it times, in the same run:
- one full render of the final conversation (``apply_chat_template`` semantics + tokenize): the baseline, the least
  any re-render comparison has to pay;
- the whole check (engine view, turn-end findings, template view) with no time budget.
and prints check time / render time. Old difflib alignment, for comparison: ``--difflib-up-to N`` also times it on
rollouts of at most N tokens (it took 8.5 s on an 8k-token one, and did not finish on 200k).

    PYTHONPATH=. .venv/bin/python bench/check_long_rollouts.py [--sizes 10000 30000 100000 300000] [--quick]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from long_rollouts import SCENARIOS, difflib_alignment  # noqa: E402
from rollouts import TOOLS  # noqa: E402

from verl_ext.check import CheckPolicy, ConsistencyChecker  # noqa: E402
from verl_ext.core.rendering import ChatRenderer, load_renderer  # noqa: E402

DEFAULT_SIZES = (10_000, 30_000, 100_000, 300_000)


def best_of(runs: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def measure(r: ChatRenderer, checker: ConsistencyChecker, name: str, size: int, runs: int, difflib_up_to: int) -> str:
    """One table row: the rollout, its render and check times, their ratio, what the check found."""
    ro = SCENARIOS[name](r, size)
    tools = None if name == "stripped" else TOOLS
    render_s = best_of(runs, lambda: r.render(ro.messages, tools, add_generation_prompt=False))
    results = []
    check_s = best_of(runs, lambda: results.append(checker.check(ro.calls, ro.sample, ro.messages, tools)))
    assert results[-1].template_view
    causes = ", ".join(f"{c}×{n}" for c, n in sorted(results[-1].cause_counts().items())) or "none"
    row = f"{ro.name:<42} {ro.tokens:>8} {render_s:>9.3f} {check_s:>9.3f} {check_s / render_s:>13.2f}  {causes}"
    if difflib_up_to and ro.tokens <= difflib_up_to:
        rendered = list(r.render(ro.messages, tools, add_generation_prompt=False, escape=False).ids)
        old_s = best_of(1, lambda: difflib_alignment(list(ro.sample.stream), rendered))
        row += f"  (old difflib alignment alone: {old_s:.2f} s = {old_s / render_s:.1f}× render)"
    return row


def tokenizer_dir() -> Path:
    path = ROOT / "build" / "tokenizers" / "qwen3"
    if not path.is_dir():
        sys.exit(f"no tokenizer at {path}: run `PYTHONPATH=. .venv/bin/python scripts/unpack_tokenizers.py` first")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES), help="target tokens per rollout")
    parser.add_argument("--scenarios", nargs="+", choices=sorted(SCENARIOS), default=list(SCENARIOS))
    parser.add_argument("--runs", type=int, default=1, help="timed runs per rollout; the best is kept")
    parser.add_argument("--quick", action="store_true", help="sizes 10000 30000 only")
    parser.add_argument("--difflib-up-to", type=int, default=0, metavar="N", help="time the old alignment up to N")
    args = parser.parse_args(argv)
    sizes = [10_000, 30_000] if args.quick else args.sizes

    print(f"loading the Qwen3 tokenizer from {tokenizer_dir()} ...", flush=True)
    r: ChatRenderer = load_renderer(tokenizer_dir())
    checker = ConsistencyChecker(r, policy=CheckPolicy(template_view_budget_s=None))
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}", flush=True)
    header = f"{'scenario':<42} {'tokens':>8} {'render s':>9} {'check s':>9} {'check/render':>13}  findings"
    rows = []
    total = len(sizes) * len(args.scenarios)
    for size in sizes:
        for name in args.scenarios:
            print(f"[{len(rows) + 1}/{total}] building {name} at ~{size} tokens ...", flush=True)
            rows.append(measure(r, checker, name, size, args.runs, args.difflib_up_to))
            print("    " + rows[-1], flush=True)
    print()
    print(header)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
