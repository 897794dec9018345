"""Prove an engine's scoring path on a canary before the re-feed audit uses it (the rule is core/refeed.py's).

Engine-agnostic: ``generate`` and ``score`` are the engine's own calls (a server object's methods, or Ray handles'
``.remote`` wrapped in coroutines): ``generate(prompt_ids, sampling_params) -> TokenOutput`` as verl's servers
answer, and ``score(ids, start, temperature) -> {"ids", "logprobs", "global_steps"}`` as the CPU engine's and
verl_ext's SGLang server's ``score`` answer. A scoring path that raises a request error is refused with that error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from verl_ext.core.errors import EngineRequestError
from verl_ext.core.refeed import CanaryVerdict, canary_verdict, refused

CANARY_TOKENS = 32  # enough positions that a path lying past its first few tokens shows; one short generation

Generate = Callable[[list[int], dict[str, Any]], Awaitable[Any]]
Score = Callable[[list[int], int, float], Awaitable[dict[str, Any]]]


async def prove_scoring_path(
    engine: str,
    generate: Generate,
    score: Score,
    prompt_ids: Sequence[int],
    *,
    tolerance: float,
    temperature: float = 1.0,
    max_tokens: int = CANARY_TOKENS,
) -> CanaryVerdict:
    """Generate ``max_tokens`` ids after ``prompt_ids`` (eos ignored, so the canary has its length), score
    ``prompt_ids + ids`` from the first generated id on, and judge the scores against the generation's logprobs
    (``canary_verdict``). Refused too when the scoring ran on other weights than the generation."""
    prompt = [int(i) for i in prompt_ids]
    params = {"temperature": temperature, "logprobs": True, "max_tokens": max_tokens, "ignore_eos": True}
    out = await generate(prompt, params)
    ids = [int(i) for i in out.token_ids]
    if not ids or out.log_probs is None:
        raise EngineRequestError(f"re-feed canary: {engine} generated no ids with logprobs for the canary prompt")
    try:
        scored = await score([*prompt, *ids], len(prompt), temperature)
    except EngineRequestError as exc:
        return refused(engine, f"its scoring request failed ({exc})", tolerance, len(ids))
    sampled_on, scored_on = (out.extra_fields or {}).get("global_steps"), scored.get("global_steps")
    if sampled_on != scored_on:
        why = f"the canary was generated on weights {sampled_on!r} and scored on {scored_on!r}; run it again"
        return refused(engine, why, tolerance, len(ids))
    return canary_verdict(engine, ids, list(out.log_probs), list(scored["ids"]), list(scored["logprobs"]), tolerance)
