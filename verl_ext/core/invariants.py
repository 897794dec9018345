"""The trajectory's invariants, checkable by one call."""

from __future__ import annotations

from dataclasses import dataclass

from verl_ext.core.trajectory import RepairKind, TokenKind, TokenTrajectory, prefix_digests

_INSERTING = (RepairKind.TRAILER, RepairKind.SYNTHETIC_CLOSE)


@dataclass(frozen=True)
class InvariantReport:
    """The result of ``check_invariants``: one line per broken invariant."""

    failures: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """Every invariant holds."""
        return not self.failures


def check_invariants(t: TokenTrajectory) -> InvariantReport:
    """Check the stream against its own record of engine calls and edits.

    - ids, kinds, turns and logprobs have equal lengths, and every id is a plain ``int``;
    - loss mask is 1 exactly on the engine's sampled spans, and logprobs are 0.0 elsewhere;
    - every prompt sent equals the stream's prefix of that length (by digest), and between two
      prompts lie, in order: the sampled output, its repairs, then the new context;
    - every repair token is in the edit log, and every inserting edit points at repair tokens.
    Returns a report whose ``failures`` name each broken invariant (empty: all hold); never raises.
    """
    n = len(t.input_ids)
    lengths = {"input_ids": n, "kinds": len(t.kinds), "turn_of": len(t.turn_of), "logprobs": len(t.logprobs)}
    if len(set(lengths.values())) != 1:
        return InvariantReport((f"unequal lengths: {lengths}",))
    types = set(map(type, t.input_ids))
    if types - {int}:
        return InvariantReport((f"ids that are not plain ints: {sorted(k.__name__ for k in types - {int})}",))
    return InvariantReport((*_mask_failures(t), *_turn_failures(t), *_edit_failures(t)))


def _mask_failures(t: TokenTrajectory) -> list[str]:
    """Loss mask 1 exactly on the sampled spans; logprob 0.0 everywhere else (the first offence of each)."""
    fail: list[str] = []
    n = len(t.input_ids)
    sampled = [False] * n
    for turn in t.turns:
        for i in range(turn.sampled_start, turn.sampled_end):
            sampled[i] = True
    mask = t.loss_mask
    for i in range(n):
        if (mask[i] == 1) != sampled[i]:
            fail.append(f"position {i}: loss mask {mask[i]} but {'inside' if sampled[i] else 'outside'} a sampled span")
            break
    for i in range(n):
        if not sampled[i] and t.logprobs[i] != 0.0:
            fail.append(f"position {i}: logprob {t.logprobs[i]} on a {t.kinds[i].value} token (must be 0.0)")
            break
    return fail


def _turn_failures(t: TokenTrajectory) -> list[str]:
    """Each prompt is a prefix of the stream; between two prompts: sampled, repairs, context, owned by their turn."""
    fail: list[str] = []
    n = len(t.input_ids)
    bounds = [turn.prompt_length for turn in t.turns] + [n]
    first = t.turns[0].prompt_length if t.turns else n
    if any(k is not TokenKind.PROMPT for k in t.kinds[:first]):
        fail.append("the first prompt holds tokens that are not of kind 'prompt'")
    stream_digests = prefix_digests(t.input_ids, (turn.prompt_length for turn in t.turns))
    for turn in t.turns:
        if stream_digests[turn.prompt_length] != turn.prompt_sha:
            fail.append(f"turn {turn.index}: the prompt sent to the engine is not a prefix of the stream")
        if turn.sampled_start != turn.prompt_length:
            fail.append(f"turn {turn.index}: the sampled output does not start right after its prompt")
        segment = t.kinds[turn.prompt_length : bounds[turn.index + 1]]
        order = [TokenKind.SAMPLED, TokenKind.REPAIR, TokenKind.CONTEXT]
        ranks = [order.index(k) if k in order else -1 for k in segment]
        if -1 in ranks or ranks != sorted(ranks):
            fail.append(f"turn {turn.index}: between prompts the stream is not sampled + repairs + context")
        owners = t.turn_of[turn.prompt_length : bounds[turn.index + 1]]
        if any(
            o != (turn.index + 1 if k is TokenKind.CONTEXT else turn.index)
            for o, k in zip(owners, segment, strict=False)
        ):
            fail.append(f"turn {turn.index}: tokens after its output are attributed to the wrong turn")
    return fail


def _edit_failures(t: TokenTrajectory) -> list[str]:
    """Every inserting edit matches the stream and covers repair tokens; every repair token is logged."""
    fail: list[str] = []
    n = len(t.input_ids)
    logged = [False] * n
    for edit in t.edits:
        if edit.kind not in _INSERTING:
            continue
        span = range(edit.position, edit.position + len(edit.token_ids))
        if span.stop > n or tuple(t.input_ids[span.start : span.stop]) != edit.token_ids:
            fail.append(f"edit {edit.kind.value} at {edit.position} does not match the stream")
            continue
        for i in span:
            if t.kinds[i] is not TokenKind.REPAIR:
                fail.append(f"edit {edit.kind.value} at {edit.position} covers a {t.kinds[i].value} token")
                break
            logged[i] = True
    unlogged = [i for i in range(n) if t.kinds[i] is TokenKind.REPAIR and not logged[i]]
    if unlogged:
        fail.append(f"repair tokens missing from the edit log at positions {unlogged[:10]}")
    return fail
