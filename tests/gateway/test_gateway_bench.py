"""bench/gateway.py's goal check: each goal fails when its figures miss it, and --check turns a failure into exit 1
(the benchmark itself runs with ``make bench``, not in the suite)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "gateway.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_gateway", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the module runs
    spec.loader.exec_module(module)
    return module


LATE = (193, 256)


def figures(gateway: float = 3.0, late: float = 5.0) -> tuple[dict, dict, tuple[int, int]]:
    """Per-turn figures: ``gateway`` at every concurrency, ``late`` the gateway in turns 193-256 (the late bucket)."""
    concurrent = {n: {"loop": 1.0, "bare": 2.0, "gateway": gateway} for n in (1, 16, 64)}
    buckets = {
        (9, 32): {"loop": 1.0, "bare": 2.0, "gateway": 3.0, "in_process": 1.0},  # ratio 1.0
        (193, 256): {"loop": 1.0, "bare": 4.0, "gateway": late, "in_process": 2.0},  # ratio late / 5
    }
    return concurrent, buckets, LATE


def held(bench: ModuleType, late_bytes: int) -> list:
    """What a session holds: 100 bytes a token half way, ``late_bytes`` over twice the tokens at the end."""
    return [bench.Held(500, 100 * 80_000, 80_000), bench.Held(1000, late_bytes, 160_000)]


def test_figures_within_the_goals_pass(bench: ModuleType) -> None:
    results = bench.verdicts(*figures())
    assert len(results) == 6 and all(v.ok for v in results)
    assert bench.exit_status(results, check=True) == 0


def test_a_gateway_over_the_ratio_fails(bench: ModuleType) -> None:
    results = bench.verdicts(*figures(gateway=4.6))  # 4.6 / (1 + 2) > 1.5
    assert [v.goal for v in results if not v.ok] == [
        "gateway / (loop + bare), 1 sessions",
        "gateway / (loop + bare), 16 sessions",
        "gateway / (loop + bare), 64 sessions",
    ]
    assert bench.exit_status(results, check=True) == 1
    assert bench.exit_status(results, check=False) == 0


def test_work_growing_faster_than_reading_fails_the_flat_goal(bench: ModuleType) -> None:
    results = bench.verdicts(*figures(late=6.5))  # 6.5 / 5 = 1.3 against 1.0 early: within 1.5, not flat
    assert [v.goal for v in results if not v.ok] == ["flat: that ratio in turns 193-256 / turns 9-32"]


def test_a_session_holding_more_per_token_as_it_grows_fails_the_memory_goal(bench: ModuleType) -> None:
    linear = bench.verdicts(*figures(), held(bench, 100 * 160_000))
    assert len(linear) == 7 and all(v.ok for v in linear)
    quadratic = bench.verdicts(*figures(), held(bench, 100 * 160_000 * 2))  # the bytes grow with turns x tokens
    assert [v.goal for v in quadratic if not v.ok] == [
        "linear memory: bytes per stream token a session holds at turn 1000 / at turn 500"
    ]


def test_the_flatness_buckets_scale_with_the_turns(bench: ModuleType) -> None:
    assert bench.late_bucket(1000) == (901, 1000) and bench.late_bucket(256) == (232, 256)
    assert bench.buckets_for(1000) == [
        (1, 1), (2, 8), (9, 32), (33, 64), (65, 128), (129, 256), (257, 512), (513, 900), (901, 1000)
    ]  # fmt: skip
    assert bench.buckets_for(256)[-2:] == [(129, 231), (232, 256)]
    assert bench.late_bucket(32) is None and bench.buckets_for(20) == [(1, 1), (2, 8), (9, 20)]
