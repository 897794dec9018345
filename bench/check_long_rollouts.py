"""The consistency check on long and repetitive rollouts (10k to 300k tokens), as a ratio to one render.

For each rollout (real Qwen3 tokenizer and template, built as in tests/long_rollouts.py) it times, in the same run,
the methods taking turns, best of ``--runs`` each, wall time and CPU time (``time.process_time``: all threads):
- one full render as transformers does it, ``apply_chat_template(messages, tools=..., tokenize=True)``: what a user
  pays for "one full render", and the least any re-render comparison has to pay;
- one full render by verl_ext's ``ChatRenderer.render`` (the render inside the check; it encodes long text in
  parallel pieces, so its wall time depends on free cores and ``TOKENIZERS_PARALLELISM``);
- the whole check (engine view, turn-end findings, template view) with no time budget;
and prints check time / render time for both renders. ``TOKENIZERS_PARALLELISM`` defaults to "true" here, as verl's
PPO runtime sets it; the machine, its load and the setting are printed. Old difflib alignment, for comparison:
``--difflib-up-to N`` also times it on rollouts of at most N tokens (it took 8.5 s on an 8k-token one, and did not
finish on 200k).

    PYTHONPATH=. .venv/bin/python bench/check_long_rollouts.py [--sizes 10000 30000 100000 300000] [--quick]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")  # verl's PPO runtime env sets it so

from _timing import fastest  # noqa: E402
from long_rollouts import SCENARIOS, difflib_alignment  # noqa: E402
from rollouts import TOOLS  # noqa: E402

from verl_ext.check import CheckPolicy, ConsistencyChecker  # noqa: E402
from verl_ext.core.rendering import ChatRenderer, load_renderer  # noqa: E402

DEFAULT_SIZES = (10_000, 30_000, 100_000, 300_000)


def load_note() -> str:
    """The machine, its load now and the tokenizers' parallelism setting (other processes share the machine)."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    parallel = os.environ.get("TOKENIZERS_PARALLELISM", "(unset)")
    return f"{platform.machine()}, {os.cpu_count()} CPUs, load average {load}, TOKENIZERS_PARALLELISM={parallel}"


def measure(r: ChatRenderer, checker: ConsistencyChecker, name: str, size: int, runs: int, difflib_up_to: int) -> str:
    """One table row: the rollout, its render and check times, their ratios, what the check found."""
    ro = SCENARIOS[name](r, size)
    tools = None if name == "stripped" else TOOLS
    results = []
    hf_kwargs = {"tools": tools, "tokenize": True, "add_generation_prompt": False}
    best = fastest(
        {
            "hf": lambda: r.tokenizer.apply_chat_template([dict(m) for m in ro.messages], **hf_kwargs),
            "render": lambda: r.render(ro.messages, tools, add_generation_prompt=False),
            "check": lambda: results.append(checker.check(ro.calls, ro.sample, ro.messages, tools)),
        },
        runs,
    )
    assert results[-1].template_view
    causes = ", ".join(f"{c}×{n}" for c, n in sorted(results[-1].cause_counts().items())) or "none"
    (hf_w, hf_c), (r_w, r_c), (c_w, c_c) = best["hf"], best["render"], best["check"]
    row = (
        f"{ro.name:<42} {ro.tokens:>8} {hf_w * 1e3:>7.1f}/{hf_c * 1e3:<7.1f} {r_w * 1e3:>7.1f}/{r_c * 1e3:<7.1f} "
        f"{c_w * 1e3:>7.1f}/{c_c * 1e3:<7.1f} {c_w / hf_w:>8.2f} {c_w / r_w:>8.2f} {c_c / r_c:>8.2f}  {causes}"
    )
    if difflib_up_to and ro.tokens <= difflib_up_to:
        rendered = list(r.render(ro.messages, tools, add_generation_prompt=False, escape=False).ids)
        started = time.perf_counter()
        difflib_alignment(list(ro.sample.stream), rendered)
        old_s = time.perf_counter() - started
        row += f"  (old difflib alignment alone: {old_s:.2f} s = {old_s / r_w:.1f}× render)"
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
    print(f"machine: {load_note()}", flush=True)
    header = (
        f"{'scenario':<42} {'tokens':>8} {'HF render ms':>15} {'render ms':>15} {'check ms':>15} "
        f"{'check/HF':>8} {'check/r':>8} {'cpu c/r':>8}  findings"
    )
    legend = (
        "ms columns: wall/CPU, fastest of each; HF render: apply_chat_template(tokenize=True); render: "
        "ChatRenderer.render; check/HF and check/r: wall-time ratios; cpu c/r: CPU-time ratio to ChatRenderer.render"
    )
    rows = []
    total = len(sizes) * len(args.scenarios)
    for size in sizes:
        for name in args.scenarios:
            print(f"[{len(rows) + 1}/{total}] building {name} at ~{size} tokens ...", flush=True)
            rows.append(measure(r, checker, name, size, args.runs, args.difflib_up_to))
            print("    " + rows[-1], flush=True)
    print()
    print(f"machine at the end: {load_note()}")
    print(legend)
    print(header)
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
