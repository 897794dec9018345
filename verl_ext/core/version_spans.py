"""Which policy version generated which tokens of one engine call: the segment contract and compact version spans.

A turn may take several engine calls (an abort for a weight update, then a resume on the new weights: see
``verl_ext.plugin.engine_turn``). Each call of a turn is one *segment*, a plain dict (``TurnOutput.segments``, JSON
in the record) with these keys, all defined here and nowhere else:

* ``ids`` (``SEG_IDS``): how many output ids the call added; ``start`` (``SEG_START``): where they start in the
  turn's output (the sum of the ``ids`` before it);
* ``stop_reason``, ``complete``: the call's stop reason and whether it stopped where the engine meant to;
* ``version`` (``SEG_VERSION``): the policy version the call was **sent** on, as the engine reports it in its
  ``verl_ext_engine`` report under ``DISPATCH_VERSION_FIELD`` (``"weight_version_at_dispatch"``). Engines stamp it
  when they accept the request, before the first token, never when the output returns. None: the engine stamps
  no dispatch version (an older engine, verl's own server): the check counts such calls as unverified;
* ``version_at_stop`` (``SEG_STOP_VERSION``): the version the engine was serving when the call stopped, reported
  under ``STOP_VERSION_FIELD`` (``"weight_version_at_stop"``), falling back to the report's ``weight_version`` (what
  SGLang's ``meta_info`` says when it produced the output). For an abort it is the version the update replaced;
* ``weight_version``: the version read when the output came back (the report's ``weight_version``, else verl's
  ``global_steps``); kept as it was before the two stamps above, and the value verl's own server would stamp;
* ``log_probs`` (``SEG_LOGPROBS``): the call's own logprobs (None: the engine returned none);
* ``ids_cut`` (``SEG_IDS_CUT``): ids the SGLang server's id check cut (returned, not covered by logprob entries):
  they were generated and dropped, the resume regenerates them;
* ``prompt_crc`` (``SEG_PROMPT_CRC``): the CRC-32 (``ids_crc``) of the prompt ids as the engine received them,
  reported under ``PROMPT_CRC_FIELD`` (``"prompt_crc32"``); None where the engine reports none. A resume's prompt
  must be the turn's prompt + the ids before it, id for id: a client that re-tokenized the partial output sent
  other ids;
* ``ids_crc``, ``logprobs_crc`` (``SEG_IDS_CRC``, ``SEG_LOGPROBS_CRC``): CRC-32 of the ids and logprobs the call
  returned, taken when it returned: the turn's joined output must hold them at ``start``.

An engine that serves partial rollouts fills ``DISPATCH_VERSION_FIELD``, ``STOP_VERSION_FIELD`` and
``PROMPT_CRC_FIELD`` in its report, with ``engine_stamps`` (CPU engine: ``engines/cpu.py``; SGLang:
``engines/sglang_server.py``). Versions are integers (verl's
``global_steps``); a digit string is read as one, anything else (SGLang's ``"default"``) as unknown (None).

The rule a stamp obeys, checkable from what is recorded: a call is sent no later than it stops
(``version <= version_at_stop``), and the next call of the turn is sent no earlier (``version_at_stop <=`` the next
``version``). A version stamped on return instead of at dispatch shows as a segment whose ``version`` is later than
the weights that stopped it (the update that aborted it came first).

From the segments, ``spans`` gives a call's ``(version, start, end)`` runs over its output ids (adjacent segments of
one version merged): the record keeps these, not a version per token.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.core.sync_labels import SyncLabel, lag, next_trained_step

DISPATCH_VERSION_FIELD = "weight_version_at_dispatch"  # engine report key: version stamped when the call was sent
STOP_VERSION_FIELD = "weight_version_at_stop"  # engine report key: version serving when the call stopped
PROMPT_CRC_FIELD = "prompt_crc32"  # engine report key: ids_crc of the prompt ids the engine received

SEG_IDS = "ids"
SEG_START = "start"
SEG_VERSION = "version"
SEG_STOP_VERSION = "version_at_stop"
SEG_RETURN_VERSION = "weight_version"
SEG_LOGPROBS = "log_probs"
SEG_IDS_CUT = "ids_cut"
SEG_STOP_REASON = "stop_reason"
SEG_COMPLETE = "complete"
SEG_PROMPT_CRC = "prompt_crc"
SEG_IDS_CRC = "ids_crc"
SEG_LOGPROBS_CRC = "logprobs_crc"

ABORT_REASONS = frozenset({"abort", "aborted"})


def as_version(value: Any) -> int | None:
    """A policy version as an int: an int, or a string of digits; None for anything else (unknown)."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def ids_crc(ids: Sequence[int]) -> int:
    """CRC-32 of token ids packed as signed 32-bit integers in the machine's byte order (little-endian on x86 and
    ARM; what ``PROMPT_CRC_FIELD`` holds). An id past 32 bits (invalid output, which the engine view names) is packed
    in 64 bits instead of failing the turn."""
    try:
        return zlib.crc32(array("i", ids).tobytes())
    except OverflowError:
        return zlib.crc32(array("q", ids).tobytes())


def engine_stamps(dispatched: Any, stopped: Any, prompt_ids: Sequence[int]) -> dict[str, Any]:
    """What an engine adds to its ``verl_ext_engine`` report for one request: the version it accepted the request
    on (read before the first token), the version serving when it stopped, and the CRC of the prompt it received."""
    return {
        DISPATCH_VERSION_FIELD: as_version(dispatched),
        STOP_VERSION_FIELD: as_version(stopped),
        PROMPT_CRC_FIELD: ids_crc(prompt_ids),
    }


def logprobs_crc(logprobs: Sequence[float] | None) -> int | None:
    """CRC-32 of logprobs packed as float64 (None: no logprobs)."""
    return None if logprobs is None else zlib.crc32(array("d", logprobs).tobytes())


def segment(
    start: int,
    new_ids: Sequence[int],
    stop_reason: Any,
    complete: bool,
    report: Mapping[str, Any],
    extra_fields: Mapping[str, Any],
    log_probs: Sequence[float] | None,
) -> dict[str, Any]:
    """The segment dict of one engine call (keys above) from its engine ``report`` (``verl_ext_engine``) and
    ``extra_fields``: ``start`` is where its ``new_ids`` (the ids it returned) begin in the turn's output."""
    returned = report.get("weight_version", extra_fields.get("global_steps"))
    cut = 0
    if report.get("ids_match_logprobs") is False:
        cut = int(report.get("returned_ids", 0)) - int(report.get("kept_ids", 0))
    lps = None if log_probs is None else [float(x) for x in log_probs]
    return {
        SEG_IDS: len(new_ids),
        SEG_START: start,
        SEG_STOP_REASON: stop_reason,
        SEG_RETURN_VERSION: returned,
        SEG_VERSION: as_version(report.get(DISPATCH_VERSION_FIELD)),
        SEG_STOP_VERSION: as_version(report.get(STOP_VERSION_FIELD, report.get("weight_version"))),
        SEG_LOGPROBS: lps,
        SEG_IDS_CUT: cut,
        SEG_COMPLETE: complete,
        SEG_PROMPT_CRC: report.get(PROMPT_CRC_FIELD),
        SEG_IDS_CRC: ids_crc(new_ids),
        SEG_LOGPROBS_CRC: logprobs_crc(lps),
    }


def resumed_fields(seg: Mapping[str, Any]) -> dict[str, Any]:
    """A segment as the record's ``resumed_turns`` keeps it: without its logprobs and CRCs (the call's logprobs and
    the ``versions`` rows hold them once)."""
    return {k: v for k, v in seg.items() if k not in (SEG_LOGPROBS, SEG_PROMPT_CRC, SEG_IDS_CRC, SEG_LOGPROBS_CRC)}


@dataclass(frozen=True)
class VersionSpan:
    """Output ids ``[start, end)`` of one engine call generated on policy ``version`` (None: not stamped)."""

    version: int | None
    start: int
    end: int

    def to_list(self) -> list[int | None]:
        """The span as the record keeps it: ``[version, start, end]``."""
        return [self.version, self.start, self.end]

    @classmethod
    def from_list(cls, row: Sequence[Any]) -> VersionSpan:
        """A span from its record form ``[version, start, end]``."""
        if len(row) != 3:
            raise ValueError(f"a version span is [version, start, end], got {list(row)!r}")
        return cls(as_version(row[0]), int(row[1]), int(row[2]))

    @property
    def tokens(self) -> int:
        return self.end - self.start


def segment_version(seg: Mapping[str, Any]) -> int | None:
    """The version a segment's ids were generated on: its dispatch stamp (None where the engine gave none)."""
    return as_version(seg.get(SEG_VERSION))


def spans(segments: Sequence[Mapping[str, Any]]) -> list[VersionSpan]:
    """One engine call's version spans from its segments: consecutive segments of one version merged; a segment's
    start is its recorded ``start`` or, for segments recorded before it was kept, the sum of the ids before it."""
    out: list[VersionSpan] = []
    at = 0
    for seg in segments:
        start = int(seg.get(SEG_START, at))
        end = start + int(seg.get(SEG_IDS, 0))
        at = end
        version = segment_version(seg)
        if out and out[-1].version == version and out[-1].end == start:
            out[-1] = VersionSpan(version, out[-1].start, end)
        elif end > start or not out:
            out.append(VersionSpan(version, start, end))
    return out


def whole_call_spans(n_ids: int, version: Any) -> list[VersionSpan]:
    """The spans of an engine call recorded without segments (one engine call, one version)."""
    return [VersionSpan(as_version(version), 0, n_ids)]


def mixes_versions(call_spans: Iterable[VersionSpan]) -> bool:
    """Were the call's tokens generated on more than one (known) version?"""
    return len({s.version for s in call_spans if s.tokens and s.version is not None}) > 1


def resumes(segments: Sequence[Mapping[str, Any]]) -> int:
    """How many times the turn was resumed (engine calls after the first)."""
    return max(0, len(segments) - 1)


@dataclass(frozen=True)
class Staleness:
    """Token-weighted staleness of some tokens against the step that trains them: ``tokens`` with a known version,
    summed ``trained_step - version`` over them, the largest lag, and ``unknown`` tokens without a version."""

    tokens: int = 0
    lag_sum: int = 0
    max_lag: int = 0
    unknown: int = 0

    @property
    def mean(self) -> float:
        return self.lag_sum / self.tokens if self.tokens else 0.0

    def __add__(self, other: Staleness) -> Staleness:
        return Staleness(
            self.tokens + other.tokens,
            self.lag_sum + other.lag_sum,
            max(self.max_lag, other.max_lag),
            self.unknown + other.unknown,
        )


def served_step(version: int) -> int:
    """The first training step a version can serve: label ``v`` serves the rollouts of step ``v + 1`` under every
    trainer (``core.sync_labels``; which weights train it there is the sync convention's)."""
    return next_trained_step(version)


def lag_of(version: int, trained_step: int, sync: SyncLabel = SyncLabel.AFTER_UPDATE) -> int | None:
    """How many weight updates lie between the weights that generated a token of ``version`` and those that step
    ``trained_step`` trains (0: on-policy; 1: one step off), under the trainer's ``sync`` convention
    (``core.sync_labels.lag``, the one definition). None where no lag is defined: a trained step below 1 (the
    standalone gateway's step 0: no trainer) or a negative version."""
    if trained_step < 1 or version < 0:
        return None
    return lag(version, trained_step, sync)


def staleness(
    call_spans: Iterable[VersionSpan], trained_step: int, sync: SyncLabel = SyncLabel.AFTER_UPDATE
) -> Staleness:
    """Token-weighted staleness of the spans' tokens when step ``trained_step`` trains on them (``lag_of``); tokens
    without a version or a defined lag are ``unknown``."""
    tokens = lag_sum = max_lag = unknown = 0
    for s in call_spans:
        lag_ = None if s.version is None else lag_of(s.version, trained_step, sync)
        if lag_ is None:
            unknown += s.tokens
            continue
        tokens += s.tokens
        lag_sum += lag_ * s.tokens
        if s.tokens:
            max_lag = max(max_lag, lag_)
    return Staleness(tokens, lag_sum, max_lag, unknown)


def older_than(
    call_spans: Iterable[VersionSpan], trained_step: int, max_lag: int, sync: SyncLabel = SyncLabel.AFTER_UPDATE
) -> list[tuple[int, int]]:
    """The ``(start, end)`` output ranges whose version lags ``trained_step`` by more than ``max_lag``."""
    out = []
    for s in call_spans:
        lag_ = None if s.version is None or not s.tokens else lag_of(s.version, trained_step, sync)
        if lag_ is not None and lag_ > max_lag:
            out.append((s.start, s.end))
    return out


@dataclass(frozen=True)
class Attempt:
    """One engine call of a turn as the record keeps it (a row of 8 numbers, JSON ``[version, start, end,
    version_at_stop, ids_cut, prompt_crc, ids_crc, logprobs_crc]``): its first three are its version span."""

    version: int | None
    start: int
    end: int
    version_at_stop: int | None = None
    ids_cut: int = 0
    prompt_crc: int | None = None
    ids_crc: int | None = None
    logprobs_crc: int | None = None

    @classmethod
    def of(cls, seg: Mapping[str, Any]) -> Attempt:
        """The row of a segment dict (the keys above)."""
        start = int(seg.get(SEG_START, 0))
        prompt_crc = seg.get(SEG_PROMPT_CRC)
        return cls(
            segment_version(seg),
            start,
            start + int(seg.get(SEG_IDS, 0)),
            as_version(seg.get(SEG_STOP_VERSION)),
            int(seg.get(SEG_IDS_CUT) or 0),
            None if prompt_crc is None else int(prompt_crc),
            seg.get(SEG_IDS_CRC),
            seg.get(SEG_LOGPROBS_CRC),
        )

    def to_list(self) -> list[int | None]:
        return [
            self.version,
            self.start,
            self.end,
            self.version_at_stop,
            self.ids_cut,
            self.prompt_crc,
            self.ids_crc,
            self.logprobs_crc,
        ]

    @classmethod
    def from_list(cls, row: Sequence[Any]) -> Attempt:
        """A row as the record holds it; ValueError naming the row for one of the wrong shape."""
        if not 3 <= len(row) <= 8 or not all(
            x is None or (isinstance(x, int) and not isinstance(x, bool)) for x in row
        ):
            raise ValueError(
                f"an engine call's attempt is [version, start, end, version_at_stop, ids_cut, prompt_crc, ids_crc, "
                f"logprobs_crc] (integers or null), got {list(row)!r}"
            )
        values = list(row) + [None] * (8 - len(row))
        return cls(values[0], int(values[1]), int(values[2]), values[3], int(values[4] or 0), *values[5:8])

    @property
    def span(self) -> VersionSpan:
        return VersionSpan(self.version, self.start, self.end)


def attempt_spans(attempts: Sequence[Attempt]) -> list[VersionSpan]:
    """The version spans of one engine call's attempts, adjacent ones of one version merged."""
    out: list[VersionSpan] = []
    for a in attempts:
        if out and out[-1].version == a.version and out[-1].end == a.start:
            out[-1] = VersionSpan(a.version, out[-1].start, a.end)
        elif a.end > a.start or not out:
            out.append(a.span)
    return out


@dataclass(frozen=True)
class RolloutVersions:
    """What a rollout's record says about policy versions: each engine call's attempts (in call order), the step
    that trains the rollout (None: not known when the rollout was recorded; the trainer's line says it) and the
    trainer's sync convention (``core.sync_labels``: what a version label counts; every lag here is read with it).
    The version that served a turn is its last attempt's (``served``)."""

    calls: tuple[tuple[Attempt, ...], ...]
    trained_step: int | None = None
    sync: SyncLabel = SyncLabel.AFTER_UPDATE

    @classmethod
    def of(
        cls,
        segments_per_call: Sequence[Sequence[Mapping[str, Any]]],
        trained_step: int | None,
        sync: SyncLabel = SyncLabel.AFTER_UPDATE,
    ) -> RolloutVersions:
        return cls(tuple(tuple(Attempt.of(s) for s in segs) for segs in segments_per_call), trained_step, sync)

    @property
    def served(self) -> list[int | None]:
        """Per engine call, the version its last attempt was sent on (the weights that finished the turn)."""
        return [call[-1].version if call else None for call in self.calls]

    def spans(self) -> list[list[VersionSpan]]:
        return [attempt_spans(call) for call in self.calls]

    def staleness(self, trained_step: int | None = None) -> Staleness:
        """Token-weighted staleness of every output token against ``trained_step`` (default: the recorded one)."""
        step = self.trained_step if trained_step is None else trained_step
        total = Staleness()
        if step is None:
            return Staleness(unknown=sum(a.end - a.start for call in self.calls for a in call))
        for call in self.calls:
            total = total + staleness(attempt_spans(call), step, self.sync)
        return total

    def lag(self, version: int) -> int | None:
        """The lag of a token of ``version`` against the recorded trained step (``lag_of``; None: not known)."""
        return None if self.trained_step is None else lag_of(version, self.trained_step, self.sync)

    def to_json(self) -> dict[str, Any]:
        return {
            "trained_step": self.trained_step,
            "sync": self.sync.value,
            "calls": [[a.to_list() for a in call] for call in self.calls],
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> RolloutVersions:
        """Raises ValueError (the record reader names the line) for a malformed object. ``sync`` is optional: a
        record written before it was kept reads as ``after_update`` (every trainer but one_step_off_policy)."""
        if not isinstance(obj, Mapping) or set(obj) - {"trained_step", "calls", "sync"}:
            raise ValueError("'versions' is an object with 'trained_step', 'calls' and optionally 'sync'")
        raw_sync = obj.get("sync", SyncLabel.AFTER_UPDATE.value)
        if raw_sync not in {s.value for s in SyncLabel}:
            raise ValueError(
                f"'versions.sync' is one of {[s.value for s in SyncLabel]} (when the trainer syncs the weights "
                f"relative to its update), got {raw_sync!r}"
            )
        step = obj.get("trained_step")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise ValueError(f"'versions.trained_step' is an integer or null, got {step!r}")
        calls = obj.get("calls") or []
        if not isinstance(calls, list) or not all(isinstance(c, list) for c in calls):
            raise ValueError("'versions.calls' is a list (one per engine call) of lists of attempt rows")
        return cls(tuple(tuple(Attempt.from_list(r) for r in call) for call in calls), step, SyncLabel(raw_sync))


def stale_mask(
    versions: RolloutVersions | None,
    output_starts: Sequence[int],
    mask: Sequence[int],
    response_start: int,
    max_lag: int | None,
) -> tuple[list[int] | None, int]:
    """``mask`` (the trainer's response mask) with 0 on every sampled token whose version lags the trained step by
    more than ``max_lag``, and how many tokens that turned from 1 to 0; ``(None, 0)`` where nothing is masked (off,
    no versions, no trained step, or no stale token). ``output_starts``: each engine call's first output token in the
    stream; ``response_start``: the stream position of the response's first token."""
    if max_lag is None or versions is None or versions.trained_step is None:
        return None, 0
    out: list[int] | None = None
    masked = 0
    for start, call in zip(output_starts, versions.calls, strict=False):
        for a, b in older_than(attempt_spans(call), versions.trained_step, max_lag, versions.sync):
            for p in range(start + a - response_start, min(start + b - response_start, len(mask))):
                if p >= 0 and mask[p]:
                    out = list(mask) if out is None else out
                    out[p] = 0
                    masked += 1
    return out, masked
