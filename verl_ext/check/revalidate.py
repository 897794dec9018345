"""Re-validate a stored rollout record's engine calls instead of trusting the verdict stored with them.

A record file is data: it may come from an older verl_ext, a loop with a bug, or a hand edit, and its ``check``
object is only what the check said when it was written. ``verl-ext report`` and ``verl-ext replay`` run the engine
view again on what the record holds (the engine calls, the trainer's stream, mask and logprobs) and add every failure
the stored verdict does not name, so a NaN logprob in a stored engine call is never "0 engine-view failures".

The image view runs again too, on the record's image evidence and each engine call's record of its images (a
record from before those were kept is compared without them, as the live check would).

What cannot be re-checked from the record alone is left to the stored verdict: the trainer's logprobs are compared
with the engine's at no tolerance (``logprob_atol`` is the run's setting, which the record does not hold), and the
engine's prompts are the stream's prefixes by construction (the record stores each prompt as a length).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection

from verl_ext.check.engine_view import check_engine_view
from verl_ext.check.findings import CauseKind, EngineFailure, FailureKind
from verl_ext.check.image_view import rollout_image_view
from verl_ext.check.inputs import EngineCall, TrainerSample
from verl_ext.check.record import (
    RecordedFailure,
    RecordedFinding,
    RolloutRecord,
    recorded_call_images,
)
from verl_ext.check.version_view import version_findings
from verl_ext.core.engine_output import validate_engine_output

REVALIDATED = "found re-validating the stored engine calls (the stored verdict did not report it): "


def stored_failures_missed(
    record: RolloutRecord, vocab_size: int | None, stop_ids: Collection[int] = ()
) -> tuple[RecordedFailure, ...]:
    """Engine-view failures of ``record``'s stored engine calls and stream that its stored check does not name (by
    kind and turn). ``vocab_size`` (the tokenizer's; None: ids are not checked against it) and ``stop_ids`` (the
    template profile's: a NaN logprob on a stop id is SGLang's substituted stop) are as the check takes them."""
    failures = engine_view_failures(record, vocab_size, stop_ids)
    named = {(f.kind, f.turn) for f in record.check.engine_failures}
    return tuple(
        RecordedFailure(f.kind.value, f.turn, f.position, REVALIDATED + f.detail)
        for f in failures
        if (f.kind.value, f.turn) not in named
    )


def revalidated(record: RolloutRecord, vocab_size: int | None, stop_ids: Collection[int] = ()) -> RolloutRecord:
    """``record`` with its check's ``engine_failures`` extended by ``stored_failures_missed`` (and ``ok`` and
    ``engine_ok`` false when there are any) and its findings by ``version_findings_missed`` (``ok`` false for a
    defect among them); the record itself when the stored verdict named everything."""
    missed = stored_failures_missed(record, vocab_size, stop_ids)
    found = version_findings_missed(record)
    if not missed and not found:
        return record
    check = record.check
    if missed:
        check = dataclasses.replace(check, ok=False, engine_ok=False, engine_failures=check.engine_failures + missed)
    if found:
        ok = check.ok and all(f.allowed for f in found)
        check = dataclasses.replace(check, ok=ok, findings=check.findings + found)
    return dataclasses.replace(record, check=check)


def version_findings_missed(record: RolloutRecord) -> tuple[RecordedFinding, ...]:
    """The version view (``check.version_view``) run again on the record's engine calls and ``versions``: its
    findings the stored verdict does not name (by cause and turn). Nothing where the record has no versions, or
    holds not every call's prompt (the trainer cut the response: a resume's prompt cannot be rebuilt)."""
    stream = record.input_ids
    if record.versions is None or any(c.prompt_length > len(stream) for c in record.engine_calls):
        return ()
    calls = [
        EngineCall(tuple(stream[: c.prompt_length]), c.output_ids, c.logprobs, c.finish_reason)
        for c in record.engine_calls
    ]
    findings, _counts = version_findings(calls, record.versions, lambda c: c.kind is CauseKind.ALLOWED)
    named = {(f.cause, f.turn) for f in record.check.findings}
    return tuple(
        dataclasses.replace(RecordedFinding.of(f), detail=REVALIDATED + f.detail)
        for f in findings
        if (f.cause.value, f.turn) not in named
    )


def engine_view_failures(
    record: RolloutRecord, vocab_size: int | None, stop_ids: Collection[int] = ()
) -> tuple[EngineFailure, ...]:
    """Every engine-view failure of the record's own data, whatever its stored verdict says: each engine call's
    prompt is the stream's first ``prompt_length`` tokens. Where a call's prompt reaches past the stream (the
    trainer cut the response), the record does not hold that prompt: only each call's own output is validated."""
    stream = record.input_ids
    p = record.prompt_length
    sample = TrainerSample(
        prompt_ids=tuple(stream[:p]),
        response_ids=tuple(stream[p:]),
        response_mask=tuple(record.loss_mask[p:]),
        response_logprobs=None if record.trainer_logprobs is None else tuple(record.trainer_logprobs[p:]),
    )
    images = _image_failures(record, sample)
    if any(c.prompt_length > len(stream) for c in record.engine_calls):
        return images + tuple(
            EngineFailure(FailureKind(problem.kind.value), k, c.prompt_length + problem.index, problem.detail)
            for k, c in enumerate(record.engine_calls)
            for problem in validate_engine_output(
                c.output_ids, c.logprobs, vocab_size, stop_ids=stop_ids, finish_reason=c.finish_reason
            )
        )
    calls = [
        EngineCall(tuple(stream[: c.prompt_length]), c.output_ids, c.logprobs, c.finish_reason)
        for c in record.engine_calls
    ]
    view = check_engine_view(calls, sample, math.inf, None, vocab_size=vocab_size, stop_ids=stop_ids)
    return view.failures + images


def _image_failures(record: RolloutRecord, sample: TrainerSample) -> tuple[EngineFailure, ...]:
    """The image view of the record (() without image evidence); evidence that is not the image view's shape is a
    ``record`` failure naming it, not a traceback."""
    try:
        return rollout_image_view(record.extra, sample, recorded_call_images(record.engine_calls)).failures
    except (KeyError, TypeError, ValueError) as exc:
        why = f"{type(exc).__name__}: {exc}"
        detail = f"the record's 'images' evidence cannot be read ({why}); the image view did not run"
        return (EngineFailure(FailureKind.RECORD, None, None, detail),)
