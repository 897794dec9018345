"""The CPU demo, run once per trainer per session: the end-to-end tests and the docs check read the same run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from verl_ext.demo.run import DemoResult, run_demo


@dataclass(frozen=True)
class DemoRun:
    """One ``verl-ext demo`` run: its result and the lines it printed (what ``make demo`` shows)."""

    result: DemoResult
    lines: tuple[str, ...]


@pytest.fixture(scope="session")
def demo_runs(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], DemoRun]:
    """``run(trainer)``: the demo with 2 GRPO steps under verl's ``"v1"`` or ``"v0"`` trainer, run on first use and
    kept for the session (each run takes minutes on 2 cores: no test starts a second one)."""
    runs: dict[str, DemoRun] = {}

    def run(trainer: str) -> DemoRun:
        if trainer not in runs:
            lines: list[str] = []
            out = tmp_path_factory.mktemp(f"demo-{trainer}")
            result = run_demo(out, steps=2, trainer=trainer, say=lines.append)
            runs[trainer] = DemoRun(result, tuple(lines))
        return runs[trainer]

    return run
