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
    failures: tuple[EngineFailure, ...]
    truncated: bool
    lost_sampled_tokens: int
    engine_stream: tuple[int, ...]  # the engine's final prompt + final output
    sampled: tuple[bool, ...]  # per engine-stream position: sampled by the engine


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
    """``vocab_size`` (the tokenizer's) and ``stop_ids`` (the template profile's) let the view name invalid engine
    output: ids the tokenizer cannot decode, NaN/inf/positive logprobs, SGLang's NaN stop, logprob counts."""
    fail: list[EngineFailure] = []

    def failure(kind: FailureKind, position: int | None, detail: str) -> None:
        fail.append(EngineFailure(kind, None if position is None else turn_at(calls, position), position, detail))

    n_resp = len(sample.response_ids)
    lengths = {"response_ids": n_resp, "response_mask": len(sample.response_mask)}
    if sample.response_logprobs is not None:
        lengths["response_logprobs"] = len(sample.response_logprobs)
    if len(set(lengths.values())) != 1:
        failure(FailureKind.LENGTH, None, f"trainer sample has unequal lengths: {lengths}")
        return EngineViewResult(tuple(fail), False, 0, (), ())
    if not calls:
        failure(FailureKind.RECORD, None, "no engine call was recorded for this rollout")
        return EngineViewResult(tuple(fail), False, 0, (), ())
    bad_logprobs: set[int] = set()
    reject_at: int | None = None  # the first stream position of invalid engine output: nothing from there trains
    for k, call in enumerate(calls):
        problems = validate_engine_output(
            call.output_ids, call.logprobs, vocab_size, stop_ids=stop_ids, finish_reason=call.finish_reason
        )
        for p in problems:
            if p.kind is OutputProblemKind.LOGPROB_COUNT:
                bad_logprobs.add(k)
            pos = call.output_start + p.index
            fail.append(EngineFailure(FailureKind(p.kind.value), k, pos, f"engine call {k}: {p.detail}"))
        if problems and reject_at is None:
            reject_at = call.output_start + trainable_length(problems, len(call.output_ids))

    last = calls[-1]
    engine = last.prompt_ids + last.output_ids
    if reject_at is not None:
        # A rollout that cut the invalid output (verl_ext's trajectory) departs from the engine at the cut or masks
        # it (a synthetic close can equal SGLang's substituted stop): compare up to the cut, and what follows must be
        # mask 0. One that kept the output (a stock loop) is compared whole.
        departs = _first_difference(sample.stream, engine)
        p = len(sample.prompt_ids)
        masked = p <= reject_at < p + n_resp and sample.response_mask[reject_at - p] == 0
        if masked or (departs is not None and departs >= reject_at):
            engine = engine[:reject_at]
    # Per position, 1 where the engine sampled it; filled and compared a slice at a time (C speed, not per token).
    sampled = bytearray(len(engine))
    logprob_spans: list[tuple[int, int, Sequence[float]]] = []  # (start, end, the engine's logprobs) per call
    for k, call in enumerate(calls):
        # Each output must reach the next prompt unchanged: a re-tokenized turn fails here.
        end = min(call.output_end, len(engine))  # a rejected output is compared up to its cut
        kept = call.output_ids[: max(0, end - call.output_start)]
        if engine[: call.output_start] != call.prompt_ids or engine[call.output_start : end] != kept:
            pos = _first_difference(engine, call.prompt_ids + call.output_ids)
            fail.append(
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
            sampled[call.output_start : end] = b"\x01" * (end - call.output_start)
            if call.logprobs is not None and k not in bad_logprobs:
                logprob_spans.append((call.output_start, end, call.logprobs))

    first_prompt = calls[0].prompt_ids
    if sample.prompt_ids != first_prompt:
        pos = _first_difference(sample.prompt_ids, first_prompt)
        failure(
            FailureKind.PREFIX,
            pos,
            f"the trainer's prompt ({len(sample.prompt_ids)} ids) is not the first prompt the engine received "
            f"({len(first_prompt)} ids); first difference at position {pos}",
        )

    stream = sample.stream
    common = min(len(stream), len(engine))
    pos = _first_difference(stream[:common], engine[:common])
    if pos is not None:
        failure(
            FailureKind.STREAM,
            pos,
            f"training stream differs from the engine's final prompt + output at position {pos}: "
            f"trainer id {stream[pos]}, engine id {engine[pos]}",
        )

    truncated = len(stream) < len(engine)
    if truncated and response_length is not None and len(sample.response_ids) != response_length:
        failure(
            FailureKind.STREAM,
            len(stream),
            f"the response ends at position {len(stream)}, short of the engine's stream ({len(engine)} tokens) but "
            f"not at the response length ({response_length}): tokens the engine produced were dropped",
        )
        truncated = False
    lost = sum(sampled[len(stream) :]) if truncated else 0
    start = len(sample.prompt_ids)
    expected_mask = bytes(sampled[start : len(stream)])
    expected_mask += bytes(len(stream) - start - len(expected_mask))
    try:
        same_mask = bytes(sample.response_mask) == expected_mask
    except (TypeError, ValueError):  # a mask value outside 0..255: compared position by position below
        same_mask = False
    mask_bad = (
        []
        if same_mask
        else [
            i
            for i in range(start, len(stream))
            if sample.response_mask[i - start] != int(i < len(engine) and sampled[i])
        ]
    )
    if mask_bad:
        i = mask_bad[0]
        failure(
            FailureKind.MASK,
            i,
            f"loss mask is {sample.response_mask[i - start]} at position {i}, where the token was "
            f"{'sampled' if i < len(engine) and sampled[i] else 'not sampled'} by the engine "
            f"({len(mask_bad)} positions wrong)",
        )
    if sample.response_logprobs is not None:
        lp_bad: list[tuple[int, float]] = []  # (position, the engine's logprob there)
        top = min(len(stream), len(engine))
        for s0, e0, engine_lps in logprob_spans:
            a, b = max(s0, start), min(e0, top)
            if a >= b:
                continue
            mine = tuple(sample.response_logprobs[a - start : b - start])
            theirs = tuple(engine_lps[a - s0 : b - s0])
            if mine != theirs:  # usually equal: one comparison per turn
                lp_bad += [
                    (i, y) for i, x, y in zip(range(a, b), mine, theirs, strict=False) if abs(x - y) > logprob_atol
                ]
        if lp_bad:
            i, engine_lp = lp_bad[0]
            failure(
                FailureKind.LOGPROB,
                i,
                f"logprob at position {i} is {sample.response_logprobs[i - start]:.6g}, the engine's is "
                f"{engine_lp:.6g} ({len(lp_bad)} positions beyond atol {logprob_atol:g})",
            )
    return EngineViewResult(tuple(fail), truncated, lost, engine, tuple(map(bool, sampled)))


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    n = min(len(a), len(b))
    if tuple(a[:n]) == tuple(b[:n]):  # usually: one C-speed comparison instead of a loop over the stream
        return None if len(a) == len(b) else n
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
