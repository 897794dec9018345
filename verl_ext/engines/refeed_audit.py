"""The re-feed audit of one engine: prove its scoring path once, then re-score the sampled fraction of rollouts.

``RefeedAuditor`` holds one engine's calls (``generate`` and ``score``, as scoring_canary.py takes them). Its first
audit runs the canary; a refused path is kept refused (every later audit returns its reason, nothing is scored).
``audit`` scores a finished rollout's whole sequence (prompt + response) from the first response position on, with
the weights the engine serves now, and compares the scores of the sampled tokens (mask 1) with the logprobs the
engine reported while sampling them (core/refeed.py: Δ = re-score − sampled, ``source="refeed"``). Run it at the end
of the rollout, before the next weight update: a re-score on other weights is not compared, and says so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from verl_ext.core.numerics import NumericsOptions
from verl_ext.core.refeed import CanaryVerdict, RefeedResult, audited, refeed_numerics
from verl_ext.engines.scoring_canary import Generate, Score, prove_scoring_path


class RefeedAuditor:
    """The audit of one engine (``engine`` names it in reasons); ``fraction`` of rollout ids are audited."""

    def __init__(
        self,
        engine: str,
        generate: Generate,
        score: Score,
        *,
        canary_prompt: Sequence[int],
        tolerance: float,
        fraction: float,
        options: NumericsOptions,
        temperature: float = 1.0,
    ) -> None:
        audited("", fraction)  # a bad fraction fails here, not at the first rollout
        self.engine, self._generate, self._score = engine, generate, score
        self.canary_prompt, self.tolerance, self.fraction = list(canary_prompt), tolerance, fraction
        self.options, self.temperature = options, temperature
        self._verdict: CanaryVerdict | None = None
        self._lock = asyncio.Lock()

    async def canary(self) -> CanaryVerdict:
        """The scoring path's canary verdict, run once (the first caller runs it; the others wait for it)."""
        async with self._lock:
            if self._verdict is None:
                self._verdict = await prove_scoring_path(
                    self.engine,
                    self._generate,
                    self._score,
                    self.canary_prompt,
                    tolerance=self.tolerance,
                    temperature=self.temperature,
                )
            return self._verdict

    async def audit(
        self,
        rollout_id: str,
        prompt_ids: Sequence[int],
        response_ids: Sequence[int],
        response_logprobs: Sequence[float],
        response_mask: Sequence[int],
        turn_starts: Sequence[int],
        sampled_version: object,
        step: int | None = None,
    ) -> RefeedResult | None:
        """The rollout's re-feed result, or None when it is not among the audited fraction."""
        if not audited(rollout_id, self.fraction):
            return None
        verdict = await self.canary()
        if not verdict.accepted:
            return RefeedResult(rollout_id, sampled_version, None, None, verdict.reason)
        prompt = [int(i) for i in prompt_ids]
        response = [int(i) for i in response_ids]
        scored = await self._score([*prompt, *response], len(prompt), self.temperature)
        if [int(i) for i in scored["ids"]] != response:
            why = f"re-feed audit: {self.engine} scored other ids than rollout {rollout_id}'s response; not compared"
            return RefeedResult(rollout_id, sampled_version, scored.get("global_steps"), None, why)
        return refeed_numerics(
            rollout_id,
            list(scored["logprobs"]),
            list(response_logprobs),
            list(response_mask),
            len(prompt),
            list(turn_starts),
            self.options,
            sampled_version=sampled_version,
            scored_version=scored.get("global_steps"),
            canary=verdict,
            step=step,
        )
