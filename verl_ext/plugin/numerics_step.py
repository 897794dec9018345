"""Once per step, in the trainer's driver (the ``Tracking.log`` hook of verl_ext.plugin.metrics_sink): drain the
step's per-rollout numbers (verl_ext.plugin.numerics_sink), append each as a ``numerics`` line to this process's
record file (numcore's writer: verl_ext.telemetry.records), and return the step's ``tito/numerics/*`` metrics
(numcore's aggregation), ``numerics_unavailable`` included: a step whose rollouts were checked but gave no number
counts them all, so the view is never silently absent.
"""

from __future__ import annotations

import logging
from typing import Any

from verl_ext.core.bounded_cache import LruCache
from verl_ext.plugin import numerics_sink, numerics_trainer
from verl_ext.telemetry.metrics import PREFIX

log = logging.getLogger("verl_ext.plugin")

NUMERICS_PREFIX = f"{PREFIX}numerics/"
# this process's numerics record writer per records folder, made on first use (one folder per job)
_WRITERS: LruCache[tuple[str, int | None, int | None], Any] = LruCache("numerics record writers", 4)


def _record_writer(settings: numerics_trainer.NumericsSettings) -> Any:
    if not settings.records_dir:
        return None
    from verl_ext.telemetry.records import RecordWriter

    key = (str(settings.records_dir), settings.max_bytes, settings.max_files)
    return _WRITERS.get_or_make(
        key,
        lambda: RecordWriter(
            settings.records_dir, None, max_bytes=settings.max_bytes, max_files=settings.max_files, prefix="numerics"
        ),
    )


def write_records(batch: numerics_sink.NumericsBatch, settings: numerics_trainer.NumericsSettings) -> int:
    """Append the batch's numerics lines; the number written (0 without a records folder). A folder that cannot be
    written is logged, never raised: training goes on."""
    writer = _record_writer(settings)
    if writer is None or not batch.measured:
        return 0
    from verl_ext.telemetry.records import numerics_record

    written = 0
    for numerics in batch.measured.values():
        try:
            writer.write(numerics_record(numerics, settings.options))
            written += 1
        except OSError as exc:
            log.error("verl_ext numerics: cannot write to %s: %s", settings.records_dir, exc)
            break
    return written


def step_metrics(step: Any, checked: float = 0.0) -> dict[str, float]:
    """The step's numerics: records written, metrics returned (module docstring). ``checked``: the step's
    ``tito/rollouts_checked`` (rollouts a verl_ext loop produced), counted unavailable when no number came."""
    batch = numerics_sink.drain()
    settings = numerics_trainer.settings() or numerics_trainer.NumericsSettings()
    if not batch and not checked:
        return {}
    written = write_records(batch, settings)
    from verl_ext.telemetry.numerics_metrics import numerics_metrics

    unavailable = batch.unavailable_count
    if not batch and checked:
        unavailable = int(checked)  # no hook saw this step's batch (a trainer verl_ext does not wrap)
        log.warning(
            "verl_ext numerics: step %s: no trainer logprobs were seen for its %d rollouts (counted in "
            "%snumerics_unavailable); the trainer in use is not one verl_ext hooks (verl's v0 and v1 trainers)",
            step,
            unavailable,
            PREFIX,
        )
    metrics = numerics_metrics(list(batch.measured.values()), settings.options, unavailable)
    metrics[f"{NUMERICS_PREFIX}masked"] = float(len(batch.masked))
    # lines a records folder was configured for and did not get (a write failed): the report would miss them
    lost = len(batch.measured) - written if settings.records_dir else 0
    metrics[f"{NUMERICS_PREFIX}records_not_written"] = float(lost)
    for name, value in batch.counters.items():
        metrics[f"{NUMERICS_PREFIX}{name}"] = float(value)
    drifting = [n for n in batch.measured.values() if n.verdict(settings.options).status == "drift"]
    if drifting:
        worst = max(drifting, key=lambda n: n.verdict(settings.options).worst_mean_abs)
        log.warning(
            "verl_ext numerics: step %s: %d of %d rollouts drift (trainer vs engine logprob); worst %s: %s",
            step,
            len(drifting),
            len(batch.measured),
            worst.rollout_id,
            worst.verdict(settings.options).reason,
        )
    return metrics
