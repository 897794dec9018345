"""The version view over generated rollouts of aborted and resumed turns: a clean rollout has no finding but the
named cuts, and each defect injected (a re-tokenized resume, a discarded segment, logprobs of another attempt, a
version stamped on return, a version going back) is caught in its turn, under its cause."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
from version_rollouts import SyntheticRollout, make_rollout, turn_segments

from verl_ext.check.findings import Cause
from verl_ext.check.inputs import EngineCall
from verl_ext.check.version_view import version_findings
from verl_ext.core.version_spans import (
    DISPATCH_VERSION_FIELD,
    PROMPT_CRC_FIELD,
    STOP_VERSION_FIELD,
    RolloutVersions,
    ids_crc,
)

SEEDS = range(30)


def _allowed(cause: Cause) -> bool:
    return cause.kind.value == "allowed"


def _view(ro: SyntheticRollout):
    return version_findings(ro.calls, RolloutVersions.of(ro.segments, None), _allowed)


def _resumed(rng: random.Random, **kw) -> tuple[SyntheticRollout, int]:
    """A rollout with at least one resumed turn, and the index of a resumed turn."""
    while True:
        ro = make_rollout(rng, **kw)
        turns = [k for k, a in enumerate(ro.attempts) if len(a) > 1]
        if turns:
            return ro, rng.choice(turns)


def _rejoin(ro: SyntheticRollout, k: int) -> None:
    """Rebuild call ``k`` and its segments from its (edited) attempts."""
    ids, lps, segs = turn_segments(ro.attempts[k])
    ro.calls[k] = EngineCall.of(ro.calls[k].prompt_ids, ids, lps)
    ro.segments[k] = segs


@pytest.mark.parametrize("seed", SEEDS)
def test_a_clean_rollout_has_no_defect_and_every_cut_is_named(seed: int) -> None:
    ro = make_rollout(random.Random(seed), abort_rate=0.5, cut_rate=0.5)
    findings, counts = _view(ro)
    assert all(f.cause is Cause.IDS_CUT_ON_ABORT and f.allowed for f in findings), findings
    cuts = sum(s["ids_cut"] for segs in ro.segments for s in segs)
    assert counts.ids_cut == cuts and len(findings) == sum(1 for segs in ro.segments for s in segs if s["ids_cut"])
    assert counts.resumes == sum(len(a) - 1 for a in ro.attempts)
    assert counts.unstamped_attempts == 0 and counts.unverified_resumes == 0


def _retokenized(ro: SyntheticRollout, k: int, rng: random.Random) -> None:
    # the resume was sent the partial output re-tokenized: its first id split in two other ids
    j = next(j for j in range(1, len(ro.attempts[k])))
    before = [i for a in ro.attempts[k][:j] for i in a.ids]
    retok = [before[0] + 1, 7, *before[1:]]
    ro.attempts[k][j].report[PROMPT_CRC_FIELD] = ids_crc(list(ro.calls[k].prompt_ids) + retok)
    _rejoin(ro, k)


def _discarded(ro: SyntheticRollout, k: int, rng: random.Random) -> None:
    # one attempt's segment lost (a resume client that rebuilds the output without its split points): its ids stay
    j = rng.randrange(len(ro.attempts[k]))
    del ro.segments[k][j]


def _dropped_ids(ro: SyntheticRollout, k: int, rng: random.Random) -> None:
    # an aborted attempt's ids dropped from the output (verl's server: token_ids = [] on an abort)
    ids, lps, segs = turn_segments(ro.attempts[k])
    n = segs[0]["ids"]
    ro.calls[k] = EngineCall.of(ro.calls[k].prompt_ids, ids[n:], lps[n:])
    ro.segments[k] = segs


def _logprobs_shifted(ro: SyntheticRollout, k: int, rng: random.Random) -> None:
    # the turn's logprobs over the first attempt are another attempt's (shifted by one)
    ids, lps, segs = turn_segments(ro.attempts[k])
    ro.calls[k] = EngineCall.of(ro.calls[k].prompt_ids, ids, lps[1:] + lps[:1])
    ro.segments[k] = segs


def _stamped_on_return(ro: SyntheticRollout, k: int, rng: random.Random) -> None:
    # the aborted attempt's version read when its output came back, after the update that aborted it
    for a in ro.attempts[k][:-1]:
        a.report[DISPATCH_VERSION_FIELD] = int(a.report["weight_version"])
    _rejoin(ro, k)


def _went_back(ro: SyntheticRollout, k: int, rng: random.Random) -> None:
    # the resume served by a replica on the old weights: sent on a version older than the abort's
    a = ro.attempts[k][-1]
    a.report[DISPATCH_VERSION_FIELD] = a.report[STOP_VERSION_FIELD] = a.truth - 2
    _rejoin(ro, k)


def _row_dropped(ro: SyntheticRollout, k: int, rng: random.Random) -> None:
    # every attempt of the turn lost: the record's versions hold an empty row for a call with output ids
    ro.segments[k] = []


MUTATIONS: dict[str, tuple[Callable[[SyntheticRollout, int, random.Random], None], Cause]] = {
    "row_dropped": (_row_dropped, Cause.SEGMENT_DISCARDED),
    "retokenized": (_retokenized, Cause.RESUME_RETOKENIZED),
    "discarded_segment": (_discarded, Cause.SEGMENT_DISCARDED),
    "dropped_ids": (_dropped_ids, Cause.SEGMENT_DISCARDED),
    "logprobs_shifted": (_logprobs_shifted, Cause.SEGMENT_LOGPROBS_MISPLACED),
    "stamped_on_return": (_stamped_on_return, Cause.VERSION_STAMPED_ON_RETURN),
    "went_back": (_went_back, Cause.VERSION_WENT_BACK),
}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_each_injected_defect_is_caught_in_its_turn(name: str, seed: int) -> None:
    rng = random.Random(seed)
    ro, k = _resumed(rng)
    assert not [f for f in _view(ro)[0] if not f.allowed]
    mutate, cause = MUTATIONS[name]
    mutate(ro, k, rng)
    defects = [f for f in _view(ro)[0] if not f.allowed]
    assert defects and {f.cause for f in defects} == {cause}, defects
    assert {f.turn for f in defects} == {k}
    assert all(f.detail for f in defects)


def test_what_the_engine_did_not_stamp_is_counted_not_checked() -> None:
    ro, k = _resumed(random.Random(1))
    for attempts in ro.attempts:
        for a in attempts:
            del a.report[DISPATCH_VERSION_FIELD], a.report[PROMPT_CRC_FIELD]
    for j in range(len(ro.attempts)):
        _rejoin(ro, j)
    findings, counts = _view(ro)
    assert not findings
    assert counts.unstamped_attempts == sum(len(a) for a in ro.attempts)
    assert counts.unverified_resumes == sum(len(a) - 1 for a in ro.attempts)


def test_a_rollout_without_versions_has_nothing_to_compare() -> None:
    ro = make_rollout(random.Random(0))
    assert version_findings(ro.calls, None, _allowed)[0] == []


def test_calls_the_versions_hold_no_row_for_are_named() -> None:
    """Versions recorded with fewer rows than the rollout's engine calls: the calls past the last row had their
    attempts dropped, never checked silently."""
    ro, _ = _resumed(random.Random(3))
    last = len(ro.calls) - 1
    del ro.segments[last]
    defects = [f for f in _view(ro)[0] if not f.allowed]
    assert defects and {(f.cause, f.turn) for f in defects} == {(Cause.SEGMENT_DISCARDED, last)}, defects
