"""One batch's rows as the numerics view needs them: each row's rollout id, turn starts and prompt length, read from
whatever form verl holds the batch in, and each row's trainer and engine logprobs summarized with numcore's
``summarize_rollout`` (verl_ext.core.numerics).

verl carries the loop's ``extra_fields`` in two shapes: the v0 trainer as one ``non_tensor_batch`` column per key
(``verl_ext_rollout_id``, ``verl_ext_turn_starts``), which ``DataProto.to_tensordict`` turns into one non-tensor
column each on the way to the workers; the v1 trainer (TransferQueue) as one ``extra_fields`` column of dicts. The
prompt is left-padded in v0 (its length is the attention mask over the prompt part) and a jagged tensor in v1.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_ext.check.numerics_verdict import two_part_verdict
from verl_ext.core.numerics import NumericsOptions, RolloutNumerics, summarize_rollout

log = logging.getLogger("verl_ext.plugin")

ROLLOUT_ID = "verl_ext_rollout_id"
TURN_STARTS = "verl_ext_turn_starts"
CHECK = "verl_ext_check"  # the check's compact verdict (CheckResult.verdict_fields): its engine_ok
EXTRA_FIELDS = "extra_fields"  # the v1 trainer's column of the loop's extra_fields dicts


@dataclass(frozen=True)
class RowKeys:
    """Per row: the rollout id (None: the row came from a loop that is not verl_ext's), the turn starts, the
    prompt length, and whether the check found the trainer's tokens the engine's (None: no check verdict)."""

    rollout_ids: list[str | None]
    turn_starts: list[list[int] | None]
    prompt_lengths: list[int]
    engine_ok: list[bool | None] = field(default_factory=list)  # empty: no row has a check verdict

    def tokens_are_engines(self, row: int) -> bool | None:
        return self.engine_ok[row] if row < len(self.engine_ok) else None


@dataclass
class RowsSummary:
    """What summarizing a batch's rows gave: a summary per measured row, the ids (and id-less rows) it could not
    measure, and why (counted by reason)."""

    measured: list[RolloutNumerics] = field(default_factory=list)
    unavailable: list[str] = field(default_factory=list)
    unavailable_without_id: int = 0
    reasons: Counter[str] = field(default_factory=Counter)
    # row indices whose two-part verdict's numbers drift: compared, as its tokens are the engine's (strict masks them)
    drifting_rows: list[int] = field(default_factory=list)


def _keys_of(data: Any) -> set[str]:
    return set(data.non_tensor_batch) if hasattr(data, "non_tensor_batch") else set(data.keys())


def _column(data: Any, key: str) -> list[Any] | None:
    """A non-tensor column as a list, from a DataProto or a TensorDict; None when the batch has no such column."""
    if hasattr(data, "non_tensor_batch"):
        column = data.non_tensor_batch.get(key)
        return None if column is None else list(column)
    if key not in data.keys():  # noqa: SIM118  (TensorDict refuses `in`: use its keys)
        return None
    return list(data[key])


def row_keys(data: Any, prompt_lengths: Sequence[int]) -> RowKeys | None:
    """The rows' ids and turn starts from either shape (module docstring); None when the batch carries neither
    (no verl_ext loop produced it, or verl dropped the columns)."""
    ids = _column(data, ROLLOUT_ID)
    starts = _column(data, TURN_STARTS)
    checks = _column(data, CHECK)
    if ids is None:
        extra = _column(data, EXTRA_FIELDS)
        if extra is None:
            return None
        ids = [e.get(ROLLOUT_ID) if isinstance(e, dict) else None for e in extra]
        starts = [e.get(TURN_STARTS) if isinstance(e, dict) else None for e in extra]
        checks = [e.get(CHECK) if isinstance(e, dict) else None for e in extra]
    if starts is None:
        starts = [None] * len(ids)
    if checks is None:
        checks = [None] * len(ids)
    return RowKeys(
        [i if isinstance(i, str) and i else None for i in ids],
        [None if s is None else [int(x) for x in s] for s in starts],
        [int(n) for n in prompt_lengths],
        [c["engine_ok"] if isinstance(c, dict) and isinstance(c.get("engine_ok"), bool) else None for c in checks],
    )


def prompt_lengths(data: Any) -> list[int]:
    """Each row's unpadded prompt length: a jagged ``prompts`` column's row lengths, or the attention mask over a
    left-padded one."""
    batch = data.batch if hasattr(data, "non_tensor_batch") else data
    prompts = batch["prompts"]
    if getattr(prompts, "is_nested", False):
        return prompts.offsets().diff().tolist()
    width = prompts.shape[-1]
    return batch["attention_mask"][:, :width].sum(-1).tolist()


def rows_of(tensor: Any) -> list[list[float]]:
    """A padded 2-D tensor's or a jagged tensor's rows as lists."""
    if getattr(tensor, "is_nested", False):
        return [row.tolist() for row in tensor.unbind()]
    return tensor.tolist()


def summarize_rows(
    keys: RowKeys,
    trainer: Sequence[Sequence[float]],
    engine: Sequence[Sequence[float]],
    mask: Sequence[Sequence[float]],
    options: NumericsOptions,
    source: str,
    step: int | None,
    skip: Sequence[bool] | None = None,
) -> RowsSummary:
    """Each row summarized on its mask-1 tokens; ``skip`` marks rows that are not rollouts (verl's padding rows).
    A row is as long as its mask without the trailing 0s (padding); trainer or engine values past that are padding
    too. A row without an id, whose logprobs are shorter than its mask, or whose numbers cannot be summarized (a
    mask value other than 0/1, a mask-1 token before its first turn start: numcore refuses them) is unavailable,
    with its reason counted; the reasons are logged once per batch, with the first refusal's message."""
    out = RowsSummary()
    first_refusal = ""
    for i, rollout_id in enumerate(keys.rollout_ids):
        if skip is not None and skip[i]:
            continue
        if rollout_id is None:
            out.unavailable_without_id += 1
            out.reasons["no_rollout_id"] += 1
            continue
        starts = keys.turn_starts[i]
        if starts is None:
            out.unavailable.append(rollout_id)
            out.reasons["no_turn_starts"] += 1
            continue
        row_mask = list(mask[i])
        while row_mask and row_mask[-1] == 0:
            row_mask.pop()
        n = len(row_mask)
        if len(trainer[i]) < n or len(engine[i]) < n:
            out.unavailable.append(rollout_id)
            out.reasons["logprobs_shorter_than_mask"] += 1
            first_refusal = first_refusal or (
                f"rollout {rollout_id}: {len(trainer[i])} trainer and {len(engine[i])} engine logprobs for a "
                f"response mask of {n} positions"
            )
            continue
        try:
            numerics = summarize_rollout(
                rollout_id, trainer[i][:n], engine[i][:n], row_mask, keys.prompt_lengths[i], starts, options, source,
                step,
            )  # fmt: skip
        except ValueError as exc:
            out.unavailable.append(rollout_id)
            out.reasons["unreadable_row"] += 1
            first_refusal = first_refusal or str(exc)
            continue
        out.measured.append(numerics)
        if _numbers_drift(keys.tokens_are_engines(i), numerics, options):
            out.drifting_rows.append(i)
    if first_refusal:
        log.warning(
            "verl_ext numerics (%s, step %s): rows not measured: %s; first: %s",
            source, step, dict(out.reasons), first_refusal,
        )  # fmt: skip
    elif out.reasons:
        log.info("verl_ext numerics (%s, step %s): rows not measured: %s", source, step, dict(out.reasons))
    return out


def _numbers_drift(engine_ok: bool | None, numerics: RolloutNumerics, options: NumericsOptions) -> bool:
    """The two-part verdict's numbers are ``drift``: compared (the check found the tokens the engine's; a row with
    no check verdict is not compared) and drifting. Defects do not matter here: they leave the engine's tokens."""
    if engine_ok is None:
        return False
    return two_part_verdict(engine_ok, 0, numerics, options).numbers == "drift"


def has_keys(data: Any) -> bool:
    """Whether the batch carries verl_ext's columns in either shape."""
    names = _keys_of(data)
    return ROLLOUT_ID in names or EXTRA_FIELDS in names
