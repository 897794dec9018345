"""The trainer's side of the numerics view: where verl's trainers compute the trainer's logprobs of a batch, join them
with the engine's by rollout id and summarize per rollout; in bypass mode, tell the FSDP ranks to measure inside the
policy loss (verl_ext.plugin.numerics_loss). Both run in the trainer's driver (verl's TaskRunner), wrapped in the
plugin's post-import style (verl_ext.plugin.post_import); neither adds a forward pass.

- v1 trainer (``verl.trainer.ppo.v1.trainer_base.PPOTrainer``, TransferQueue): after ``_compute_old_log_prob`` has
  written ``old_log_probs``, one read of the batch's ``old_log_probs``, ``rollout_log_probs``, ``response_mask``,
  ``prompts`` and ``extra_fields`` (the loop's ``verl_ext_rollout_id`` and ``verl_ext_turn_starts``).
- v0 trainer (``verl.trainer.ppo.ray_trainer.RayPPOTrainer``): ``_compute_old_log_prob(batch)`` returns the
  ``old_log_probs``; the batch beside it holds ``rollout_log_probs``, the mask and the id columns.
- Bypass mode (``algorithm.rollout_correction.bypass_mode``, no old-logprob pass): ``_update_actor`` puts a
  ``verl_ext_numerics`` entry (the step, the options, strict or not) into the batch's meta information, which verl
  hands to every micro-batch the loss sees; the rollouts of the batch are registered as expected, so those that no
  micro-batch measured are counted ``numerics_unavailable``.

Strict mode (``verl_ext.numerics.policy=strict``; the check's own mode does not set it) zeroes the response mask of a
rollout whose two-part verdict's numbers drift (only where they are compared: its tokens are the engine's) before
verl computes advantages (the old-logprob pass comes first), counted in ``tito/numerics/masked``; in bypass mode the
loss masks it instead (advantages exist by then).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from verl_ext.core.numerics import NumericsOptions
from verl_ext.plugin import numerics_sink
from verl_ext.plugin.numerics_rows import (
    EXTRA_FIELDS,
    ROLLOUT_ID,
    RowKeys,
    prompt_lengths,
    row_keys,
    rows_of,
    summarize_rows,
)

log = logging.getLogger("verl_ext.plugin")

ANNOUNCE_KEY = "verl_ext_numerics"  # the batch meta entry that switches the loss's measuring on (bypass mode)
SOURCE_OLD_LOG_PROB = "old_log_prob"


class NumericsStrictError(RuntimeError):
    """Strict mode found every rollout of a batch drifting: nothing would be left to train on (verl itself refuses
    a batch whose response masks are all 0, with an error that does not say why)."""


def _refuse_all_drifting(summary: Any, rows: int, step: int, options: NumericsOptions) -> None:
    if rows and len(summary.drifting_rows) == rows:
        worst = max(summary.measured, key=lambda n: n.verdict(options).worst_mean_abs)
        raise NumericsStrictError(
            f"verl_ext numerics (strict): every one of step {step}'s {rows} rollouts drifts (the trainer's logprobs "
            f"against the engine's; worst {worst.rollout_id}: {worst.verdict(options).reason}); masking them all "
            "leaves nothing to train on. Fix: read the numerics lines of the records (verl-ext report) for where it "
            "starts; if this level is expected on your hardware, raise verl_ext.numerics.drift_mean_abs_delta "
            f"(now {options.drift_mean_abs_delta}); or run with the warn policy"
        )


@dataclass(frozen=True)
class NumericsSettings:
    """What the driver needs of verl_ext's options: thresholds, policy and where records go."""

    options: NumericsOptions = NumericsOptions()
    strict: bool = False
    records_dir: str | None = None
    max_bytes: int = 64 * 1024 * 1024
    max_files: int = 4

    def announcement(self, step: int) -> dict[str, Any]:
        """The bypass-mode switch the ranks read: plain values, so it survives verl's non-tensor plumbing."""
        o = self.options
        return {
            "step": int(step),
            "strict": self.strict,
            "depth_edges": list(o.depth_edges),
            "drift_mean_abs_delta": o.drift_mean_abs_delta,
            "token_abs_delta": o.token_abs_delta,
        }


_settings: NumericsSettings | None = None


def settings() -> NumericsSettings | None:
    """The settings of the trainer running in this process (None before its first batch)."""
    return _settings


def settings_of(config: Any) -> NumericsSettings:
    """From the trainer's config (``verl_ext`` section): read once per process; the preflight validated it."""
    global _settings
    if _settings is None:
        from verl_ext.plugin.options import LoopOptions

        section = config.get("verl_ext") if hasattr(config, "get") else None
        opts = LoopOptions.from_sources(section)
        _settings = NumericsSettings(
            options=opts.numerics,
            strict=opts.numerics.policy == "strict",  # verl_ext.numerics.policy, apart from the check's mode
            records_dir=opts.records.dir,
            max_bytes=opts.records.max_bytes,
            max_files=opts.records.max_files,
        )
    return _settings


def bypass_mode(config: Any) -> bool:
    corr = config.algorithm.get("rollout_correction", None)
    return bool(corr and corr.get("bypass_mode", False))


def _report(summary: Any, keys: RowKeys, skip: list[bool] | None, masked: int) -> None:
    expected = [i for n, i in enumerate(keys.rollout_ids) if i is not None and not (skip and skip[n])]
    # ``masked`` rows are the first ones of summary.drifting_rows (strict), which all carry an id (they were measured)
    ids = [keys.rollout_ids[r] for r in summary.drifting_rows[:masked]]
    numerics_sink.report(
        summary.measured, summary.unavailable, summary.unavailable_without_id, expected, masked=[i for i in ids if i]
    )


# -- v0 (RayPPOTrainer, DataProto) -------------------------------------------------------------------------


def measure_v0(trainer: Any, batch: Any, old_log_prob: Any) -> None:
    """Summarize the batch's rows from the old-logprob pass's output; in strict mode zero the drifting rows'
    response mask in place (the batch verl goes on with)."""
    s = settings_of(trainer.config)
    keys = row_keys(batch, prompt_lengths(batch))
    if keys is None:
        numerics_sink.report(unavailable_without_id=len(batch))
        return
    if "rollout_log_probs" not in batch.batch.keys():  # noqa: SIM118  (TensorDict refuses `in`)
        numerics_sink.report(unavailable=[i for i in keys.rollout_ids if i], expected=[])
        return
    mask = batch.batch["response_mask"]
    summary = summarize_rows(
        keys,
        rows_of(old_log_prob.batch["old_log_probs"]),
        rows_of(batch.batch["rollout_log_probs"]),
        rows_of(mask),
        s.options,
        SOURCE_OLD_LOG_PROB,
        trainer.global_steps,
    )
    masked = 0
    if s.strict and summary.drifting_rows:
        _refuse_all_drifting(summary, len(keys.rollout_ids), trainer.global_steps, s.options)
        mask[summary.drifting_rows] = 0  # before advantages: the rollout is out of the loss and the advantage
        masked = len(summary.drifting_rows)
    _report(summary, keys, None, masked)


def announce_v0(trainer: Any, batch: Any) -> None:
    """Bypass mode: the step's switch for the loss, and the batch's rollouts as expected."""
    s = settings_of(trainer.config)
    batch.meta_info[ANNOUNCE_KEY] = s.announcement(trainer.global_steps)
    ids = batch.non_tensor_batch.get(ROLLOUT_ID)
    known = [i for i in ids if isinstance(i, str) and i] if ids is not None else []
    numerics_sink.report(expected=known, unavailable_without_id=len(batch) - len(known))


def install_v0(module: Any) -> None:
    """Wrap ``RayPPOTrainer._compute_old_log_prob`` and ``_update_actor`` (verl.trainer.ppo.ray_trainer)."""
    cls = module.RayPPOTrainer
    if getattr(cls._compute_old_log_prob, "_verl_ext", False):
        return
    compute, update = cls._compute_old_log_prob, cls._update_actor

    def _compute_old_log_prob(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        out = compute(self, batch, *args, **kwargs)
        _guarded(measure_v0, self, batch, out[0] if isinstance(out, tuple) else out)
        return out

    def _update_actor(self: Any, batch: Any, *args: Any, **kwargs: Any) -> Any:
        if bypass_mode(self.config):
            _guarded(announce_v0, self, batch)
        return update(self, batch, *args, **kwargs)

    _mark(_compute_old_log_prob, _update_actor)
    cls._compute_old_log_prob, cls._update_actor = _compute_old_log_prob, _update_actor


# -- v1 (PPOTrainer, TransferQueue) ------------------------------------------------------------------------


def _padding_rows(batch: Any) -> list[bool]:
    return [bool(tag.get("is_padding", False)) for tag in batch.tags]


def measure_v1(trainer: Any, batch: Any) -> None:
    """After the old-logprob pass wrote ``old_log_probs`` to TransferQueue: read the batch's fields once and
    summarize; in strict mode write the drifting rows' masks back as zeros."""
    import transfer_queue as tq

    s = settings_of(trainer.config)
    fields = ["old_log_probs", "response_mask", "prompts", EXTRA_FIELDS]
    if trainer.config.actor_rollout_ref.rollout.calculate_log_probs:
        fields.append("rollout_log_probs")
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=fields)
    skip = _padding_rows(batch)
    keys = row_keys(data, prompt_lengths(data))
    if keys is None:
        numerics_sink.report(unavailable_without_id=sum(not p for p in skip))
        return
    if "rollout_log_probs" not in data.keys():  # noqa: SIM118  no engine logprobs: nothing to compare with
        numerics_sink.report(unavailable=[i for n, i in enumerate(keys.rollout_ids) if i and not skip[n]])
        return
    mask_rows = rows_of(data["response_mask"])
    summary = summarize_rows(
        keys,
        rows_of(data["old_log_probs"]),
        rows_of(data["rollout_log_probs"]),
        mask_rows,
        s.options,
        SOURCE_OLD_LOG_PROB,
        trainer.global_steps,
        skip,
    )
    masked = 0
    if s.strict and summary.drifting_rows:
        _refuse_all_drifting(summary, sum(not p for p in skip), trainer.global_steps, s.options)
        masked = _mask_v1(tq, batch, data, summary.drifting_rows)
    _report(summary, keys, skip, masked)


def _mask_v1(tq: Any, batch: Any, data: Any, rows: list[int]) -> int:
    """Zero the response (and loss) mask of ``rows`` in TransferQueue, before verl computes advantages."""
    import torch
    from tensordict import TensorDict

    drifting = set(rows)
    rows_now = data["response_mask"].unbind()
    masks = [torch.zeros_like(m) if i in drifting else m.clone() for i, m in enumerate(rows_now)]
    nested = torch.nested.as_nested_tensor(masks, layout=torch.jagged)
    fields = TensorDict({"response_mask": nested, "loss_mask": nested.clone()}, batch_size=[len(masks)])
    tq.kv_batch_put(keys=batch.keys, partition_id=batch.partition_id, fields=fields)
    return len(drifting)


def announce_v1(trainer: Any, batch: Any) -> None:
    """Bypass mode: the step's switch for the loss (``extra_info`` reaches every rank's batch), and the batch's
    rollouts as expected."""
    import transfer_queue as tq

    s = settings_of(trainer.config)
    batch.extra_info[ANNOUNCE_KEY] = s.announcement(trainer.global_steps)
    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=[EXTRA_FIELDS])
    skip = _padding_rows(batch)
    extra = list(data[EXTRA_FIELDS])
    ids = [e.get(ROLLOUT_ID) if isinstance(e, dict) else None for n, e in enumerate(extra) if not skip[n]]
    known = [i for i in ids if isinstance(i, str) and i]
    numerics_sink.report(expected=known, unavailable_without_id=len(ids) - len(known))


def install_v1(module: Any) -> None:
    """Wrap ``PPOTrainer._compute_old_log_prob`` and ``_update_actor`` (verl.trainer.ppo.v1.trainer_base); the v1
    trainers that override the first (separate-async) call it through ``super()``."""
    cls = module.PPOTrainer
    if getattr(cls._compute_old_log_prob, "_verl_ext", False):
        return
    compute, update = cls._compute_old_log_prob, cls._update_actor

    def _compute_old_log_prob(self: Any, batch: Any, metrics: dict, *args: Any, **kwargs: Any) -> Any:
        out = compute(self, batch, metrics, *args, **kwargs)
        if not bypass_mode(self.config):  # bypass: the loss measures (announce_v1)
            _guarded(measure_v1, self, out)
        return out

    def _update_actor(self: Any, batch: Any, metrics: dict, *args: Any, **kwargs: Any) -> Any:
        if bypass_mode(self.config):
            _guarded(announce_v1, self, batch)
        return update(self, batch, metrics, *args, **kwargs)

    _mark(_compute_old_log_prob, _update_actor)
    cls._compute_old_log_prob, cls._update_actor = _compute_old_log_prob, _update_actor


# -- shared ------------------------------------------------------------------------------------------------


def _guarded(fn: Any, *args: Any) -> None:
    """The view must never stop training; a failure is logged with its cause, and the step's rollouts then have
    no number (the Tracking hook counts what was expected and not measured)."""
    try:
        fn(*args)
    except NumericsStrictError:
        raise  # strict mode's refusal is meant to stop the run
    except Exception:
        log.exception("verl_ext numerics: %s failed; this batch's rollouts are counted unavailable", fn.__name__)


def _mark(*fns: Any) -> None:
    for fn in fns:
        fn._verl_ext = True
