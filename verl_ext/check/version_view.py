"""The version view: one rollout's engine calls across aborts and weight updates, attempt by attempt.

A turn an engine aborted (a weight update, a partial rollout) and resumed is one engine call of several attempts
(``core.version_spans``: what each attempt's row records). The view proves, from the record alone:

* each attempt's ids and logprobs are where the turn's output holds them: the attempts tile the output in order, the
  ids at each attempt's place are the ids it returned (``segment_discarded`` where not: an attempt dropped, or ids no
  attempt returned) and the logprobs are the ones it returned (``segment_logprobs_misplaced``);
* a resume was sent the turn's prompt + the ids before it, id for id (the engine's CRC of the prompt it received;
  ``resume_retokenized`` where the partial output was re-tokenized on the way);
* an attempt's version is no later than the weights that stopped it (``version_stamped_on_return``) and versions
  never go back along the rollout (``version_went_back``);
* ids the id check cut before a resume are named (``ids_cut_on_abort``, allowed: they were regenerated).

What it cannot prove is counted in ``VersionCounts``: attempts whose engine stamped no dispatch version, resumes
whose engine reported no prompt CRC. No torch, Ray or verl here.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from verl_ext.check.findings import Cause, Finding, Span
from verl_ext.check.inputs import EngineCall
from verl_ext.core.version_spans import Attempt, RolloutVersions, ids_crc, logprobs_crc


@dataclass
class VersionCounts:
    """What the view saw of a rollout: resumes, ids cut, and what it could not verify."""

    resumes: int = 0
    ids_cut: int = 0
    unstamped_attempts: int = 0  # no dispatch version from the engine: its version is not checked
    unverified_resumes: int = 0  # the engine reported no prompt CRC: the resume's prompt is not checked


def version_findings(
    calls: Sequence[EngineCall], versions: RolloutVersions | None, allowed: Callable[[Cause], bool]
) -> tuple[list[Finding], VersionCounts]:
    """The version view's findings and counts on a rollout's engine calls (``versions``: the attempts of each call;
    None: nothing to compare, no finding). A call without attempts (an empty row, or past the last row) is
    ``segment_discarded``: every loop records at least one attempt per call."""
    counts = VersionCounts()
    if versions is None:
        return [], counts
    out: list[Finding] = []
    last: int | None = None  # the latest version seen along the rollout
    crcs = _PromptCrcs()
    for k, call in enumerate(calls):
        crcs.add(call)
        attempts = versions.calls[k] if k < len(versions.calls) else ()
        if not attempts:  # every loop records one attempt at least per call: this call's were dropped
            whole = Attempt(None, 0, len(call.output_ids))
            detail = f"no attempt is recorded for this engine call's {len(call.output_ids)} ids (its row was dropped)"
            out.append(_finding(Cause.SEGMENT_DISCARDED, k, call, whole, detail, allowed))
            continue
        counts.resumes += len(attempts) - 1
        out += _placement(k, call, attempts, counts, allowed, crcs)
        for j, a in enumerate(attempts):
            counts.unstamped_attempts += a.version is None
            counts.ids_cut += a.ids_cut
            if a.version is not None and a.version_at_stop is not None and a.version > a.version_at_stop:
                detail = f"attempt {j} sent on version {a.version}, stopped on {a.version_at_stop}"
                out.append(_finding(Cause.VERSION_STAMPED_ON_RETURN, k, call, a, detail, allowed))
            elif a.version is not None and last is not None and a.version < last:
                detail = f"attempt {j} sent on version {a.version} after version {last} served this rollout"
                out.append(_finding(Cause.VERSION_WENT_BACK, k, call, a, detail, allowed))
            known = [v for v in (a.version, a.version_at_stop) if v is not None]
            last = max([*known, *([] if last is None else [last])], default=None)
    return out, counts


def _placement(
    k: int,
    call: EngineCall,
    attempts: Sequence[Attempt],
    counts: VersionCounts,
    allowed: Callable[[Cause], bool],
    crcs: _PromptCrcs,
) -> list[Finding]:
    """Findings on where call ``k``'s attempts lie in its output, and on what its resumes were sent."""
    out: list[Finding] = []
    ids, lps = call.output_ids, call.logprobs
    at = 0
    misplaced = False  # an attempt's ids are not at its place: the prompts after it cannot be compared
    for j, a in enumerate(attempts):
        if a.start != at or not 0 <= a.start <= a.end <= len(ids):
            detail = f"attempt {j} recorded at [{a.start}, {a.end}) where the output's ids so far end at {at}"
            return [*out, _finding(Cause.SEGMENT_DISCARDED, k, call, a, detail, allowed)]
        at = a.end
        if a.ids_crc is not None and ids_crc(ids[a.start : a.end]) != a.ids_crc:
            detail = f"the output's ids at [{a.start}, {a.end}) are not the {a.end - a.start} ids attempt {j} returned"
            out.append(_finding(Cause.SEGMENT_DISCARDED, k, call, a, detail, allowed))
            misplaced = True
        elif a.logprobs_crc is not None and lps is not None and logprobs_crc(lps[a.start : a.end]) != a.logprobs_crc:
            detail = f"the logprobs at [{a.start}, {a.end}) are not the ones attempt {j} returned"
            out.append(_finding(Cause.SEGMENT_LOGPROBS_MISPLACED, k, call, a, detail, allowed))
        if a.ids_cut:
            detail = f"attempt {j}: {a.ids_cut} ids returned without logprobs were cut and regenerated by the resume"
            out.append(_finding(Cause.IDS_CUT_ON_ABORT, k, call, a, detail, allowed))
        if j == 0 or misplaced:
            continue  # the first attempt's prompt is the engine view's to prove
        if a.prompt_crc is None:
            counts.unverified_resumes += 1
            continue
        if crcs.sent(call, a.start) != a.prompt_crc:
            detail = (
                f"attempt {j} was sent other ids than the turn's prompt + its first {a.start} output ids (a resume "
                "that re-tokenized the partial output)"
            )
            out.append(_finding(Cause.RESUME_RETOKENIZED, k, call, a, detail, allowed))
    if at != len(ids):
        detail = f"the attempts end at {at}, the output holds {len(ids)} ids: ids no attempt returned"
        out.append(_finding(Cause.SEGMENT_DISCARDED, k, call, attempts[-1], detail, allowed))
    return out


class _PromptCrcs:
    """The CRC of each engine call's prompt, chained along the rollout: a call whose prompt is the previous call's
    prompt + output + new ids (``EngineCall.after``/``shared``/``tail``, as the loops record them) costs a CRC of its
    new ids and output, not of its whole prompt; any other call reads its prompt once."""

    def __init__(self) -> None:
        self._prompt: dict[int, int] = {}  # id(call) -> CRC of its prompt
        self._full: dict[int, int] = {}  # id(call) -> CRC of its prompt + output

    def add(self, call: EngineCall) -> None:
        after = call.after
        if after is None and call.shared == 0:
            crc = zlib.crc32(_bytes(call.tail))
        elif after is not None and id(after) in self._full and call.shared == after.output_end:
            crc = zlib.crc32(_bytes(call.tail), self._full[id(after)])
        else:
            crc = zlib.crc32(_bytes(call.stream()[: call.prompt_length]))
        self._prompt[id(call)] = crc
        self._full[id(call)] = zlib.crc32(_bytes(call.output_ids), crc)

    def sent(self, call: EngineCall, start: int) -> int:
        """The CRC of what a resume at output ``start`` should have been sent: the prompt + the first ids."""
        return zlib.crc32(_bytes(call.output_ids[:start]), self._prompt[id(call)])


def _bytes(ids: Sequence[int]) -> bytes:
    """Ids as ``ids_crc`` packs them (32-bit); an id past 32 bits (no tokenizer has one) packed in 64, so the CRC
    cannot match and the check says so rather than fail."""
    if isinstance(ids, array) and ids.typecode == "i":
        return ids.tobytes()
    try:
        return array("i", ids).tobytes()
    except OverflowError:
        return array("q", ids).tobytes()


def _finding(
    cause: Cause, k: int, call: EngineCall, a: Attempt, detail: str, allowed: Callable[[Cause], bool]
) -> Finding:
    start = call.prompt_length + max(0, min(a.start, len(call.output_ids)))
    end = call.prompt_length + max(0, min(a.end, len(call.output_ids)))
    ids = tuple(call.output_ids[start - call.prompt_length : end - call.prompt_length][:16])
    return Finding(
        cause=cause,
        allowed=allowed(cause),
        turn=k,
        boundary="",
        region="sampled",
        stream=Span(start, end),
        rendered=Span(0, 0),
        stream_ids=ids,
        rendered_ids=(),
        stream_text="",
        rendered_text="",
        context_before="",
        context_after="",
        detail=detail,
    )
