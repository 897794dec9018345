"""The SGLang server's scoring path (the re-feed audit's): a prefill with input logprobs through SGLang's own request.

One ``GenerateReqInput`` whose input is the ids to score, with ``return_logprob`` and ``logprob_start_len`` at the
last context id (SGLang's input logprobs: entry ``k`` scores input id ``k`` after the ids before it, the first entry
is ``None``) and one sampled token, ignored (the request the forced first turn sends, forced_turn.py). SGLang's input
logprobs are at temperature 1 (not scaled by the request's temperature), so only temperature 1 is scored. The
scored ids are read back from SGLang's answer, not assumed: the canary compares them with the ids sent. This module
does not import SGLang.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from verl_ext.core.errors import EngineRequestError
from verl_ext.engines.forced_turn import scoring_request


def score_request(request_id: str, ids: Sequence[int], start: int, temperature: float) -> dict[str, Any]:
    """``GenerateReqInput`` fields scoring ``ids[start:]`` after ``ids[:start]``. Raises ``EngineRequestError`` for
    a temperature other than 1 (SGLang's input logprobs are not temperature-scaled) or no context / nothing to
    score."""
    if float(temperature) != 1.0:
        raise EngineRequestError(
            f"verl_ext SGLang scoring: temperature {temperature} asked, but SGLang's input logprobs are at "
            "temperature 1; the re-feed audit runs on SGLang only with temperature 1 sampling"
        )
    if not 0 < start < len(ids):
        raise EngineRequestError(
            f"verl_ext SGLang scoring: needs 0 < start < len(ids), got start {start} for {len(ids)} ids"
        )
    return scoring_request(request_id, list(ids[:start]), list(ids[start:]))


def input_scores(output: Mapping[str, Any], count: int) -> tuple[list[int], list[float]]:
    """The ids and logprobs of the last ``count`` input-logprob entries of a scoring answer, as SGLang reported them
    (a missing or non-finite value is NaN, so the canary sees it). Raises ``EngineRequestError`` when SGLang
    returned fewer entries."""
    entries = list((output.get("meta_info") or {}).get("input_token_logprobs") or [])
    if len(entries) < count:
        raise EngineRequestError(
            f"verl_ext SGLang scoring: SGLang returned {len(entries)} input logprob entries for {count} scored ids"
        )
    tail = entries[len(entries) - count :]
    ids = [int(e[1]) if e[1] is not None else -1 for e in tail]
    values = [float(e[0]) if e[0] is not None and math.isfinite(float(e[0])) else math.nan for e in tail]
    return ids, values
