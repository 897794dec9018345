"""Carry check results from the agent-loop workers to verl's tracker, as ``tito/`` metrics once per step.

verl's v0 and v1 trainers log one metrics dict per step through ``verl.utils.tracking.Tracking.log``, in the
TaskRunner; agent loops run in other Ray actors and verl has no channel for custom per-step metrics. So loops send
each result to a small named Ray actor, and the plugin wraps ``Tracking.log`` to drain it into the step's dict.
Without Ray (in-process tests) results collect in this process.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Mapping
from typing import Any

from verl_ext.check.findings import CheckResult
from verl_ext.plugin.collectors import named_collector
from verl_ext.telemetry.async_metrics import async_ratios
from verl_ext.telemetry.metrics import PREFIX, aggregate

log = logging.getLogger("verl_ext.plugin")

ACTOR_NAME = "verl_ext_tito_metrics"


class MetricsCollector:
    """Check results and loop counters since the last drain."""

    def __init__(self) -> None:
        self._results: list[CheckResult] = []
        self._counters: Counter[str] = Counter()
        self._lock = threading.Lock()

    def add(self, result: CheckResult | None, counters: Mapping[str, float]) -> None:
        """Keep one rollout's check result (None when skipped) and add its counters; thread-safe."""
        with self._lock:
            if result is not None:
                self._results.append(result)
            self._counters.update(counters)

    def take(self) -> tuple[list[CheckResult], Counter[str]]:
        """Everything since the last take, handed over and forgotten here."""
        with self._lock:
            taken = (self._results, self._counters)
            self._results, self._counters = [], Counter()
        return taken


def _metrics(results: list[CheckResult], counters: Counter[str]) -> dict[str, float]:
    if not results and not counters:
        return {}
    # counters alone (every rollout bypassed verl_ext's loops) still show, without check metrics
    metrics = aggregate(results) if results else {}
    metrics.update({f"{PREFIX}{k}": float(v) for k, v in counters.items()})
    async_ratios(metrics, PREFIX)  # the step's staleness and shares from the summed tito/async/ counters
    return metrics


_local = MetricsCollector()


def _ray_collector() -> Any:
    """The job's collector of check results and counters."""
    return named_collector(MetricsCollector, ACTOR_NAME)


def report(result: CheckResult | None, counters: Mapping[str, float]) -> None:
    """Send one rollout's result (fire-and-forget under Ray)."""
    try:
        import ray

        if ray.is_initialized():
            _ray_collector().add.remote(result, dict(counters))
            return
    except ImportError:
        pass
    _local.add(result, counters)


def count(counters: Mapping[str, float]) -> None:
    """Send counters that belong to no check result (which loop ran a rollout)."""
    report(None, counters)


def drain() -> dict[str, float]:
    """Everything reported since the last drain (this process and the job's Ray workers), aggregated once;
    {} when nothing was reported."""
    results, counters = _local.take()
    try:
        import ray

        if ray.is_initialized():
            try:
                actor = ray.get_actor(ACTOR_NAME)
            except ValueError:
                actor = None  # no verl_ext loop has reported in this job
            if actor is not None:
                remote_results, remote_counters = ray.get(actor.take.remote(), timeout=60)
                results += remote_results
                counters.update(remote_counters)
    except ImportError:
        pass
    return _metrics(results, counters)


def warn_if_bypassed(metrics: Mapping[str, float], step: Any) -> None:
    """Once per step: rollouts that ran a loop other than verl_ext's while a verl_ext loop is the default."""
    bypassed = int(metrics.get(f"{PREFIX}loop/bypassed", 0))
    if not bypassed:
        return
    loop = f"{PREFIX}loop/"
    ran = {k[len(loop) :]: int(v) for k, v in metrics.items() if k.startswith(loop)}
    ran.pop("bypassed", None)
    ran.pop("switched", None)
    log.warning(
        "verl_ext: step %s: %d of %d rollouts bypassed verl_ext (loops run: %s): their dataset rows name another "
        "loop in the `agent_name` column, which overrides rollout.agent.default_agent_loop; their tokens were "
        "not checked. Fix: set those rows' agent_name to the verl_ext loop or drop the column; rows naming "
        "tool_agent switch by themselves with verl_ext.agent_name_column=switch (the default).",
        step,
        bypassed,
        sum(ran.values()),
        ", ".join(f"{name} {n}" for name, n in sorted(ran.items())),
    )


def install_tracking_hook(tracking_module: Any) -> None:
    """Wrap ``Tracking.log`` so each step's metrics include the tito/ metrics of the rollouts since the last step,
    and the trainer's numbers of them (``tito/numerics/``, with their record lines written)."""
    tracking = tracking_module.Tracking
    if getattr(tracking.log, "_verl_ext", False):
        return
    original = tracking.log

    def log_with_tito(self: Any, data: dict[str, Any], step: int, *args: Any, **kwargs: Any) -> Any:
        try:
            tito = drain()
        except Exception:  # a metrics hiccup must not stop training; but it must be seen
            log.exception("verl_ext: could not collect tito/ metrics for step %s", step)
            tito = {}
        warn_if_bypassed(tito, step)
        try:  # the trainer's numbers of the step's rollouts (verl_ext.plugin.numerics_step)
            from verl_ext.plugin.numerics_step import step_metrics

            # a validation log (no training/global_step) has rollouts but, by design, no trainer numbers
            checked = tito.get(f"{PREFIX}rollouts_checked", 0.0) if "training/global_step" in data else 0.0
            tito.update(step_metrics(step, checked))
        except Exception:
            log.exception("verl_ext: could not collect tito/numerics/ metrics for step %s", step)
        return original(self, {**data, **tito} if tito else data, step, *args, **kwargs)

    log_with_tito._verl_ext = True  # type: ignore[attr-defined]
    tracking.log = log_with_tito
