"""``verl-ext demo``: the CPU GRPO run, with progress on the terminal (see verl_ext.demo.run)."""

from __future__ import annotations

import argparse
from pathlib import Path

from verl_ext.cli.options import check_output_folder
from verl_ext.core.errors import OptionsError
from verl_ext.demo.run import LOOPS, MODELS, PARK_TOKENS, TRAINERS, check_choices, counted, run_demo, shown
from verl_ext.plugin.overrides import check_overrides, check_verl_ext_overrides


def run_demo_command(args: argparse.Namespace) -> int:
    """``verl-ext demo``: run the CPU GRPO demo; exit code 1 when any step had an engine-view failure."""
    if args.steps < 1:
        raise OptionsError(f"--steps must be at least 1, got {args.steps}")
    loop, model = args.loop, args.model
    check_choices(loop, model, args.trainer)  # before the output folder is made: a refused choice leaves nothing behind
    check_overrides(args.overrides)  # Hydra's lexer error for an unquoted special token, with the quoted fix
    check_verl_ext_overrides(args.overrides)  # verl_ext's options, as the agent loop would refuse them minutes later
    check_output_folder(args.out, "--out")  # before the model, the data and the trainer: a wrong path costs nothing
    harness = " running the demo's harness (verl_ext/demo/harness.py) through the gateway" if loop == "gateway" else ""
    trainer = f"{counted(args.steps, 'GRPO step')} of {TRAINERS[args.trainer]} on CPU"
    if args.bypass:
        trainer += " in bypass mode"
    print(
        f"verl-ext demo: {trainer}, with {LOOPS[loop]}{harness}, the verl_ext_cpu engine and {MODELS[model]} "
        "(the first assistant turn is a forced "
        f"{'screenshot' if model == 'qwen2.5-vl' else 'calculator'} call: a demo-only hook, see docs/cpu-engine.md"
        + (
            f"; one request per weight version is held after {PARK_TOKENS} sampled ids until verl's abort, so a turn "
            "resumes across every weight update: a demo-only hook, see docs/async.md"
            if args.trainer == "colocate-async"
            else ""
        )
        + ")",
        flush=True,
    )
    result = run_demo(
        Path(args.out),
        steps=args.steps,
        trainer=args.trainer,
        extra_overrides=args.overrides,
        loop=loop,
        model=model,
        bypass=args.bypass,
    )
    if result.returncode != 0:
        return result.returncode
    failures = sum(m.get("tito/engine_view_failures", 0) for m in result.steps.values())
    print(
        f"done in {result.seconds:.0f}s: {counted(len(result.steps), 'step')}, engine-view failures {failures:g}"
        + (f", report {shown(result.report)}" if result.report else "")
    )
    return 0 if failures == 0 else 1
