"""Does a replay reproduce what was trained? The replayed stream against a record's ``input_ids`` and ``loss_mask``,
and the replaying tokenizer against the record file header's fingerprint.

A replay that does not compare proves nothing: with another tokenizer, or a template that renders today's date
(``strftime_now``) replayed on another day, it rebuilds a different stream whose own invariants all hold. Each
function here returns one line naming where the two differ (token position, ids and text on both sides) or None.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from verl_ext.check.record import RolloutRecord
from verl_ext.check.record_header import RecordHeader
from verl_ext.core.rendering import ChatRenderer

Decode = Callable[[Sequence[int]], str]
_SHOWN = 8  # tokens of text shown on each side of a difference


def fingerprint_difference(header: RecordHeader, renderer: ChatRenderer, given: str) -> str | None:
    """Whether ``renderer`` (with the header's template kwargs) is the tokenizer and chat template the records were
    checked with (``ChatRenderer.fingerprint``: tokenizer, template and template kwargs). ``given`` names the
    replaying tokenizer as the user passed it (``--tokenizer DIR``)."""
    if not header.fingerprint:
        return None  # a header from before the fingerprint was written: nothing to compare
    mine = renderer.with_template_kwargs(dict(header.profile.template_kwargs)).fingerprint
    if mine == header.fingerprint:
        return None
    return (
        f"the records were written with tokenizer {header.profile.tokenizer_name!r} (fingerprint {header.fingerprint})"
        f", the replay uses {given} (fingerprint {mine}): another tokenizer, chat template or template kwargs. "
        "Replay with the tokenizer folder (and --chat-template) the rollouts used"
    )


def stream_difference(
    recorded: RolloutRecord, ids: Sequence[int], mask: Sequence[int], renderer: ChatRenderer
) -> str | None:
    """Where the replayed stream (``ids``, ``mask``) first differs from the recorded ``input_ids`` / ``loss_mask``;
    None when they are equal. The replay is first cut where the trainer cut the rollout (``trained_length``)."""
    rec = tuple(recorded.input_ids)
    end = trained_length(recorded, mask)
    rep = tuple(ids[:end])
    first = _first_difference(rec, rep)
    if first is None and len(rec) == len(rep):
        bad = _first_difference(tuple(recorded.loss_mask), tuple(mask[:end]))
        if bad is None:
            return None
        return (
            f"the loss mask differs at token {bad}: recorded {recorded.loss_mask[bad]}, replayed {mask[bad]} "
            f"({renderer.decode(rec[bad : bad + 1])!r})"
        )
    at = min(len(rec), len(rep)) if first is None else first
    decode = renderer.decode
    cut = f", cut at the response length {recorded.response_length}" if end < len(ids) else ""
    line = (
        f"the replayed stream differs from the recorded input_ids at token {at} (recorded {len(rec)} tokens, "
        f"replayed {len(rep)}{cut}): after {decode(rec[max(0, at - _SHOWN) : at])!r} the record has "
        f"{_side(rec, at, decode)}, the replay {_side(rep, at, decode)}"
    )
    if at < recorded.prompt_length and "strftime_now" in (renderer.chat_template or ""):
        line += (
            "; the chat template renders today's date (strftime_now) and the difference is in the prompt: a rollout "
            "recorded on another day renders another date"
        )
    return line


def trained_length(recorded: RolloutRecord, mask: Sequence[int]) -> int:
    """How many tokens of the replayed stream (whose loss mask is ``mask``) the trainer kept: the stream up to the
    record's ``response_length`` past its prompt (as ``trainer_sample_from_trajectory`` cuts it). A turn that filled
    the budget ends at the cap, and the synthetic close the loop adds after it lies past the cap, untrained.

    A record from before version 3 has no ``response_length``; its cut is inferred, and only where nothing sampled
    is lost by it: the recorded stream is shorter and either the check said the trainer cut it (``check.truncated``)
    or the last engine call ended at the length limit and every replayed token past the record is untrained."""
    n = len(mask)
    if recorded.response_length is not None:
        return min(n, recorded.prompt_length + recorded.response_length)
    kept = len(recorded.input_ids)
    if kept >= n:
        return n
    if recorded.check.truncated:
        return kept
    calls = recorded.engine_calls
    if calls and calls[-1].finish_reason == "length" and not any(mask[kept:]):
        return kept
    return n


def _first_difference(a: tuple[int, ...], b: tuple[int, ...]) -> int | None:
    """The first position where ``a`` and ``b`` differ within the shorter; None when one is a prefix of the other."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # usually: one comparison at C speed
        return None
    return next(i for i in range(n) if a[i] != b[i])


def _side(ids: tuple[int, ...], at: int, decode: Decode) -> str:
    """The ids from ``at`` as text and ids (a few), or that the stream ends there."""
    if at >= len(ids):
        return "nothing (its stream ends there)"
    part = ids[at : at + _SHOWN]
    return f"{decode(part)!r} (ids {list(part)})"
