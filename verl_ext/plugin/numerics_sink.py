"""Carry the trainer's per-rollout numbers (``RolloutNumerics``) to the driver, once per step.

They are measured in two kinds of process: the trainer's driver (the old-logprob pass, verl_ext.plugin.numerics_trainer)
and the FSDP ranks (bypass mode, inside the policy loss: verl_ext.plugin.numerics_loss), whose own metrics verl
averages over ranks. So every summary goes to one small named Ray actor, as plugin/metrics_sink.py does for the
check's results, and the driver's ``Tracking.log`` hook drains it. The collector keeps one summary per rollout id:
ranks that hold the same micro-batch (tensor or sequence parallel) send the same rollout twice, and a rollout is
measured once per step. It also keeps the ids the driver expected a number for, so that a rollout that got none is
counted (``numerics_unavailable``), never silently absent. Without Ray (in-process tests) all of it stays in this
process.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from verl_ext.core.numerics import RolloutNumerics
from verl_ext.plugin.collectors import named_collector

ACTOR_NAME = "verl_ext_tito_numerics"


@dataclass
class NumericsBatch:
    """What one drain hands over: a summary per measured rollout (by id), the rollouts that got no number (ids, and
    rows that carried no id), the rollouts strict mode took out of the loss (``masked``, by id) and other counters.
    Rows without an id reported with a ``batch_key`` (the micro-batch's identity, from the FSDP ranks) count once
    per key: ranks that hold the same micro-batch (tensor or sequence parallel) report the same rows; the driver's
    own counts (no key) are summed."""

    measured: dict[str, RolloutNumerics] = field(default_factory=dict)
    unavailable: set[str] = field(default_factory=set)
    unavailable_without_id: int = 0
    without_id_by_batch: dict[Hashable, int] = field(default_factory=dict)
    expected: set[str] = field(default_factory=set)
    masked: set[str] = field(default_factory=set)
    counters: Counter[str] = field(default_factory=Counter)

    @property
    def unavailable_count(self) -> int:
        """Rollouts with no number: expected or reported unavailable, and not measured; plus rows without an id."""
        missing = (self.unavailable | self.expected) - set(self.measured)
        return len(missing) + self.unavailable_without_id + sum(self.without_id_by_batch.values())

    def __bool__(self) -> bool:
        return bool(
            self.measured
            or self.unavailable
            or self.unavailable_without_id
            or self.without_id_by_batch
            or self.expected
        )

    def merge(self, other: NumericsBatch) -> None:
        """Add ``other`` in: one summary per rollout id, one no-id count per batch key."""
        for numerics in other.measured.values():
            self.measured.setdefault(numerics.rollout_id, numerics)  # a second copy (another rank) is the same one
        self.unavailable |= other.unavailable
        self.unavailable_without_id += other.unavailable_without_id
        self.without_id_by_batch.update(other.without_id_by_batch)
        self.expected |= other.expected
        self.masked |= other.masked
        self.counters.update(other.counters)


class NumericsCollector:
    """Summaries, unavailable and expected rollout ids since the last take; thread-safe (the Ray actor runs its
    methods on one thread, in-process tests call it from several)."""

    def __init__(self) -> None:
        self._batch = NumericsBatch()
        self._lock = threading.Lock()

    def add(
        self,
        measured: Iterable[RolloutNumerics] = (),
        unavailable: Iterable[str] = (),
        unavailable_without_id: int = 0,
        expected: Iterable[str] = (),
        counters: Mapping[str, float] | None = None,
        masked: Iterable[str] = (),
        batch_key: Hashable | None = None,
    ) -> None:
        """One report; ``batch_key``: the micro-batch's identity, so its rows without an id count once."""
        part = NumericsBatch(
            measured={n.rollout_id: n for n in measured},
            unavailable=set(unavailable),
            expected=set(expected),
            masked=set(masked),
            counters=Counter(counters or {}),
        )
        if batch_key is None:
            part.unavailable_without_id = unavailable_without_id
        elif unavailable_without_id:
            part.without_id_by_batch[batch_key] = unavailable_without_id
        with self._lock:
            self._batch.merge(part)

    def take(self) -> NumericsBatch:
        with self._lock:
            taken, self._batch = self._batch, NumericsBatch()
        return taken


_local = NumericsCollector()


def _ray_collector() -> Any:
    """The job's collector of rollouts' numbers (``collectors.named_collector``: a live cluster's handle)."""
    return named_collector(NumericsCollector, ACTOR_NAME)


def report(
    measured: Iterable[RolloutNumerics] = (),
    unavailable: Iterable[str] = (),
    unavailable_without_id: int = 0,
    expected: Iterable[str] = (),
    counters: Mapping[str, float] | None = None,
    masked: Iterable[str] = (),
    batch_key: Hashable | None = None,
) -> None:
    """Send what one pass saw (``NumericsCollector.add``). Under Ray this waits for the collector to have it: the
    driver drains right after the update returns, and a message still in flight would land in the next step."""
    args = (
        list(measured), list(unavailable), unavailable_without_id, list(expected), dict(counters or {}), list(masked),
        batch_key,
    )  # fmt: skip
    try:
        import ray

        if ray.is_initialized():
            ray.get(_ray_collector().add.remote(*args), timeout=60)
            return
    except ImportError:
        pass
    _local.add(*args)


def drain() -> NumericsBatch:
    """Everything reported since the last drain, from this process and the job's Ray workers."""
    batch = _local.take()
    try:
        import ray

        if ray.is_initialized():
            try:
                actor = ray.get_actor(ACTOR_NAME)
            except ValueError:
                actor = None  # nothing measured anywhere in this job yet
            if actor is not None:
                batch.merge(ray.get(actor.take.remote(), timeout=60))
    except ImportError:
        pass
    return batch
