"""Engine view: hard invariants between the engine's record and the trainer's sample.

A failure here means the trainer trains on tokens (or logprobs) the engine did not produce: a bug,
never something to allow. A response cut at the trainer's response length is not a failure: it is
reported as truncation, with the number of sampled tokens lost.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from verl_ext.check.findings import EngineFailure, FailureKind
from verl_ext.check.inputs import EngineCall, TrainerSample
from verl_ext.core.engine_output import OutputProblemKind, trainable_length, validate_engine_output


@dataclass(frozen=True)
class EngineViewResult:
    """What ``check_engine_view`` found: its failures (empty: the trainer trains on the engine's tokens), whether
    the training stream is a cut of the engine's, and the engine stream with which positions the engine sampled."""

    failures: tuple[EngineFailure, ...]
    truncated: bool
    lost_sampled_tokens: int
    engine_stream: tuple[int, ...]  # the engine's final prompt + final output
    sampled_bytes: bytes  # per engine-stream position: 1 where the engine sampled it, else 0

    @property
    def sampled(self) -> tuple[bool, ...]:
        """Per engine-stream position: sampled by the engine (built on demand: a 100k-token stream's tuple of bools
        costs milliseconds, and the check itself reads the bytes)."""
        return tuple(map(bool, self.sampled_bytes))


def turn_at(calls: Sequence[EngineCall], position: int) -> int:
    """The engine call a stream position belongs to: the last call whose prompt ends at or before it."""
    turn = 0
    for k, call in enumerate(calls):
        if call.output_start <= position:
            turn = k
    return turn


def check_engine_view(
    calls: Sequence[EngineCall],
    sample: TrainerSample,
    logprob_atol: float,
    response_length: int | None = None,
    *,
    vocab_size: int | None = None,
    stop_ids: Collection[int] = (),
) -> EngineViewResult:
    """Compare the trainer's sample with the engine's record of the rollout; every mismatch is a failure.

    ``vocab_size`` (the tokenizer's) and ``stop_ids`` (the template profile's) let the view name invalid engine
    output: ids the tokenizer cannot decode, NaN/inf/positive logprobs, SGLang's NaN stop, logprob counts.
    ``response_length`` is the trainer's cap: a stream shorter than the engine's is truncation only when its
    response is exactly that long. Never raises on bad input: a sample of unequal lengths or a rollout with no
    engine call returns that one failure and an empty engine stream.
    """
    shape = _sample_shape_failures(calls, sample)
    if shape:
        return EngineViewResult(tuple(shape), False, 0, (), b"")
    output = _validate_outputs(calls, vocab_size, stop_ids)
    stream = sample.stream  # a property that concatenates: built once here
    engine = _engine_stream(calls, sample, stream, output.reject_at)
    replayed = _replay_calls(calls, engine, output.bad_logprobs)
    failures = [*output.failures, *replayed.failures, *_prompt_failures(calls, sample)]
    stream_failures, truncated = _stream_failures(calls, sample, stream, engine, response_length)
    failures += stream_failures
    failures += _mask_failures(calls, sample, stream, engine, replayed.sampled)
    failures += _logprob_failures(calls, sample, len(stream), engine, replayed.logprob_spans, logprob_atol)
    lost = replayed.sampled.count(1, len(stream)) if truncated else 0
    return EngineViewResult(tuple(failures), truncated, lost, engine, bytes(replayed.sampled))


def _failure(calls: Sequence[EngineCall], kind: FailureKind, position: int | None, detail: str) -> EngineFailure:
    """A failure at a stream position (None: the whole sample), with the engine call it falls in."""
    return EngineFailure(kind, None if position is None else turn_at(calls, position), position, detail)


def _sample_shape_failures(calls: Sequence[EngineCall], sample: TrainerSample) -> list[EngineFailure]:
    """Step 1: what makes the comparison impossible: a sample of unequal lengths, or no engine call."""
    lengths = {"response_ids": len(sample.response_ids), "response_mask": len(sample.response_mask)}
    if sample.response_logprobs is not None:
        lengths["response_logprobs"] = len(sample.response_logprobs)
    if len(set(lengths.values())) != 1:
        return [_failure(calls, FailureKind.LENGTH, None, f"trainer sample has unequal lengths: {lengths}")]
    if not calls:
        return [_failure(calls, FailureKind.RECORD, None, "no engine call was recorded for this rollout")]
    return []


@dataclass
class _Outputs:
    failures: list[EngineFailure]
    bad_logprobs: set[int]  # calls whose logprobs do not pair with their ids: no logprob of theirs is compared
    reject_at: int | None  # the first stream position of invalid engine output: nothing from there trains


def _validate_outputs(calls: Sequence[EngineCall], vocab_size: int | None, stop_ids: Collection[int]) -> _Outputs:
    """Step 2: each call's output as the engine returned it: ids in the vocabulary, finite logprobs, one per id."""
    out = _Outputs([], set(), None)
    for k, call in enumerate(calls):
        problems = validate_engine_output(
            call.output_ids, call.logprobs, vocab_size, stop_ids=stop_ids, finish_reason=call.finish_reason
        )
        for p in problems:
            if p.kind is OutputProblemKind.LOGPROB_COUNT:
                out.bad_logprobs.add(k)
            pos = call.output_start + p.index
            out.failures.append(EngineFailure(FailureKind(p.kind.value), k, pos, f"engine call {k}: {p.detail}"))
        if problems and out.reject_at is None:
            out.reject_at = call.output_start + trainable_length(problems, len(call.output_ids))
    return out


def _engine_stream(
    calls: Sequence[EngineCall], sample: TrainerSample, stream: Sequence[int], reject_at: int | None
) -> tuple[int, ...]:
    """Step 3: the stream the trainer must match: the last call's prompt + output, cut at invalid output when the
    rollout cut it there."""
    engine = tuple(calls[-1].stream())
    if reject_at is not None:
        # A rollout that cut the invalid output (verl_ext's trajectory) departs from the engine at the cut or masks
        # it (a synthetic close can equal SGLang's substituted stop): compare up to the cut, and what follows must be
        # mask 0. One that kept the output (a stock loop) is compared whole.
        departs = _first_difference(stream, engine)
        p = len(sample.prompt_ids)
        masked = p <= reject_at < p + len(sample.response_ids) and sample.response_mask[reject_at - p] == 0
        if masked or (departs is not None and departs >= reject_at):
            engine = engine[:reject_at]
    return tuple(engine)


@dataclass
class _Replayed:
    failures: list[EngineFailure]
    # Per engine-stream position, 1 where the engine sampled it; filled and compared a slice at a time (C speed,
    # not per token).
    sampled: bytearray
    logprob_spans: list[tuple[int, int, Sequence[float]]]  # (start, end, the engine's logprobs) per usable call


def _replay_calls(calls: Sequence[EngineCall], engine: Sequence[int], bad_logprobs: set[int]) -> _Replayed:
    """Step 4: each call's prompt + output must be a prefix of the engine stream (a re-tokenized turn fails here);
    marks which positions the engine sampled, with their logprobs. Every call is compared at every position, in one
    pass over the chain of calls: a call recorded after another (``EngineCall.after``) shares that call's first
    ids, already compared, so only its own ids are."""
    out = _Replayed([], bytearray(len(engine)), [])
    engine = tuple(engine)
    differs: dict[int, int | None] = {}  # id(call) -> its first difference from the engine stream (within both)
    for k, call in enumerate(calls):
        pos = differs[id(call)] = _call_difference(call, engine, differs)
        if pos is None and call.output_start <= len(engine):
            end = min(call.output_end, len(engine))  # a rejected output is compared up to its cut
        else:
            if pos is None:  # the prompt is longer than the engine stream: it departs where the stream ends
                pos = len(engine)
            out.failures.append(
                EngineFailure(
                    FailureKind.PREFIX,
                    k,
                    pos,
                    f"engine call {k}'s prompt + output is not a prefix of the final engine prompt "
                    f"(first difference at position {pos}): a turn was changed after the engine returned it",
                )
            )
            continue
        if end > call.output_start:
            out.sampled[call.output_start : end] = b"\x01" * (end - call.output_start)
            if call.logprobs is not None and k not in bad_logprobs:
                out.logprob_spans.append((call.output_start, end, call.logprobs))
    return out


def _call_difference(call: EngineCall, engine: tuple[int, ...], differs: dict[int, int | None]) -> int | None:
    """The first position where ``call``'s prompt + output differs from ``engine``, within both (None: it agrees
    wherever both have ids). A call after one already compared (in ``differs``) shares its first ``shared`` ids:
    they differ where that call first differs, if before ``shared``; only the call's own ids are compared."""
    base = call.after
    if base is None or id(base) not in differs:
        own: Sequence[int] = call.stream()
        start = 0
    else:
        before = differs[id(base)]
        if before is not None and before < call.shared:
            return before
        own, start = (*call.tail, *call.output_ids), call.shared
    end = min(len(engine), start + len(own))
    if end <= start:
        return None
    mine = tuple(own[: end - start])
    if mine == engine[start:end]:  # usually: one C-speed comparison of the call's own ids
        return None
    return start + next(i for i, (x, y) in enumerate(zip(mine, engine[start:end], strict=True)) if x != y)


def _prompt_failures(calls: Sequence[EngineCall], sample: TrainerSample) -> list[EngineFailure]:
    """Step 5: the trainer's prompt is the first prompt the engine received."""
    first_prompt = calls[0].prompt_ids
    if sample.prompt_ids == first_prompt:
        return []
    pos = _first_difference(sample.prompt_ids, first_prompt)
    return [
        _failure(
            calls,
            FailureKind.PREFIX,
            pos,
            f"the trainer's prompt ({len(sample.prompt_ids)} ids) is not the first prompt the engine received "
            f"({len(first_prompt)} ids); first difference at position {pos}",
        )
    ]


def _stream_failures(
    calls: Sequence[EngineCall],
    sample: TrainerSample,
    stream: Sequence[int],
    engine: Sequence[int],
    response_length: int | None,
) -> tuple[list[EngineFailure], bool]:
    """Step 6: the training ``stream`` (``sample.stream``) is the engine stream, or a cut of it at the response
    length. Returns the failures and whether the stream is truncated."""
    out: list[EngineFailure] = []
    common = min(len(stream), len(engine))
    pos = _first_difference(stream[:common], engine[:common])
    if pos is not None:
        out.append(
            _failure(
                calls,
                FailureKind.STREAM,
                pos,
                f"training stream differs from the engine's final prompt + output at position {pos}: "
                f"trainer id {stream[pos]}, engine id {engine[pos]}",
            )
        )
    truncated = len(stream) < len(engine)
    if truncated and response_length is not None and len(sample.response_ids) != response_length:
        out.append(
            _failure(
                calls,
                FailureKind.STREAM,
                len(stream),
                f"the response ends at position {len(stream)}, short of the engine's stream ({len(engine)} tokens) "
                f"but not at the response length ({response_length}): tokens the engine produced were dropped",
            )
        )
        truncated = False
    return out, truncated


def _mask_failures(
    calls: Sequence[EngineCall], sample: TrainerSample, stream: Sequence[int], engine: Sequence[int], sampled: bytearray
) -> list[EngineFailure]:
    """Step 7: the loss mask is 1 exactly where the engine sampled the token (``stream``: ``sample.stream``)."""
    start = len(sample.prompt_ids)
    expected_mask = bytes(sampled[start : len(stream)])
    expected_mask += bytes(len(stream) - start - len(expected_mask))
    try:
        if bytes(sample.response_mask) == expected_mask:  # usually: one C-speed comparison
            return []
    except (TypeError, ValueError):  # a mask value outside 0..255: compared position by position below
        pass
    mask_bad = [
        i for i in range(start, len(stream)) if sample.response_mask[i - start] != int(i < len(engine) and sampled[i])
    ]
    if not mask_bad:
        return []
    i = mask_bad[0]
    return [
        _failure(
            calls,
            FailureKind.MASK,
            i,
            f"loss mask is {sample.response_mask[i - start]} at position {i}, where the token was "
            f"{'sampled' if i < len(engine) and sampled[i] else 'not sampled'} by the engine "
            f"({len(mask_bad)} positions wrong)",
        )
    ]


def _logprob_failures(
    calls: Sequence[EngineCall],
    sample: TrainerSample,
    stream_length: int,
    engine: Sequence[int],
    logprob_spans: Sequence[tuple[int, int, Sequence[float]]],
    logprob_atol: float,
) -> list[EngineFailure]:
    """Step 8: the trainer's logprobs are the engine's, within ``logprob_atol``, where the engine sampled."""
    if sample.response_logprobs is None:
        return []
    start = len(sample.prompt_ids)
    lp_bad: list[tuple[int, float]] = []  # (position, the engine's logprob there)
    top = min(stream_length, len(engine))
    for s0, e0, engine_lps in logprob_spans:
        a, b = max(s0, start), min(e0, top)
        if a >= b:
            continue
        mine = tuple(sample.response_logprobs[a - start : b - start])
        theirs = tuple(engine_lps[a - s0 : b - s0])
        if mine != theirs:  # usually equal: one comparison per turn
            lp_bad += [(i, y) for i, x, y in zip(range(a, b), mine, theirs, strict=False) if abs(x - y) > logprob_atol]
    if not lp_bad:
        return []
    i, engine_lp = lp_bad[0]
    return [
        _failure(
            calls,
            FailureKind.LOGPROB,
            i,
            f"logprob at position {i} is {sample.response_logprobs[i - start]:.6g}, the engine's is "
            f"{engine_lp:.6g} ({len(lp_bad)} positions beyond atol {logprob_atol:g})",
        )
    ]


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    n = min(len(a), len(b))
    if tuple(a[:n]) == tuple(b[:n]):  # usually: one C-speed comparison instead of a loop over the stream
        return None if len(a) == len(b) else n
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
