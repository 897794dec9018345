"""The gateway's engine on a running SGLang server: its native ``POST /generate`` with ``input_ids`` and
``return_logprob``, read as verl_ext's SGLang rollout server reads SGLang's output (``verl_ext.engines.sglang_output``).

Token in, token out: the prompt is the session's ids, the answer the ids SGLang sampled (the stop token kept) with
their logprobs. What the rollout server checks is checked here too (the logprob entries' ids equal the output ids,
their counts agree), but an output that fails the check, an aborted request or an error answer is an error naming
it (the gateway ends the session with ``engine_error`` and records what it holds): the engine broke its contract,
and a gateway call has no partial sample to fall back on. Works with a server launched with or without
``--skip-tokenizer-init`` (its ``text`` is not read).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from typing import Any

import httpx

from verl_ext.core.errors import EngineRequestError
from verl_ext.engines.sglang_output import ABORT_REASONS, build_request, engine_report
from verl_ext.gateway.engine import Sampled, Sampling

log = logging.getLogger("verl_ext.gateway")


class SGLangEngine:
    """A running SGLang server at ``url`` (``http://host:port``). ``max_context`` is the model's context length
    (prompt + output; None: SGLang's own limit applies)."""

    def __init__(self, url: str, *, max_context: int | None = None, timeout_s: float = 600.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise EngineRequestError(f"the SGLang server URL must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.max_context = max_context
        self.timeout_s = timeout_s

    def check_reachable(self) -> None:
        """``GET /health`` once (at startup): raises EngineRequestError naming the URL when nothing answers."""
        try:
            response = httpx.get(f"{self.url}/health", timeout=30)
        except httpx.HTTPError as exc:
            raise EngineRequestError(
                f"no SGLang server answers at {self.url} ({type(exc).__name__}: {exc}); start it (python -m "
                "sglang.launch_server --model-path ...) or fix --sglang-url"
            ) from exc
        if response.status_code != 200:
            raise EngineRequestError(
                f"the SGLang server at {self.url} is not healthy: GET /health {response.status_code}"
            )

    def request(self, prompt_ids: Sequence[int], sampling: Sampling) -> dict[str, Any]:
        """The ``/generate`` body: ``input_ids``, SGLang's sampling parameters, ``return_logprob``."""
        params: dict[str, Any] = {
            "max_new_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
        }
        if sampling.top_k > 0:
            params["top_k"] = sampling.top_k
        if sampling.repetition_penalty != 1.0:
            params["repetition_penalty"] = sampling.repetition_penalty
        if sampling.stop_ids:
            params["stop_token_ids"] = list(sampling.stop_ids)
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed  # as SGLang's own OpenAI layer passes a request's seed
        body, _ = build_request(
            f"verl-ext-gateway-{uuid.uuid4().hex}",
            prompt_ids,
            params,
            response_length=sampling.max_tokens,
            prompt_length=len(prompt_ids),
            # the gateway has fitted max_tokens to max_context already: the budget goes to SGLang as it is
            max_model_len=len(prompt_ids) + sampling.max_tokens + 1,
        )
        return body

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Sampled:
        """One ``/generate`` call; raises EngineRequestError for an error answer, an abort, or ids the logprobs do
        not cover."""
        body = self.request(prompt_ids, sampling)
        try:
            async with httpx.AsyncClient(timeout=self.timeout_s) as client:
                response = await client.post(f"{self.url}/generate", json=body)
        except httpx.HTTPError as exc:
            raise EngineRequestError(f"the SGLang server at {self.url}: {type(exc).__name__}: {exc}") from exc
        output = _output(response, self.url)
        budget = body["sampling_params"]["max_new_tokens"]
        report, logprobs = engine_report(output, budget)
        if report.finish_type in ABORT_REASONS:
            raise EngineRequestError(f"the SGLang server aborted the request: {report.finish_message or 'no message'}")
        if not report.ids_match_logprobs:
            raise EngineRequestError(
                f"the SGLang server's logprob entries do not match its output ids ({report.id_check_detail}); the "
                "sampled ids cannot be trusted"
            )
        if not report.finish_consistent:
            log.warning("SGLang at %s: %s (the gateway judges the finish from the ids)", self.url, report.finish_detail)
        if report.prompt_tokens is not None and int(report.prompt_tokens) != len(body["input_ids"]):
            log.warning(
                "SGLang at %s counted %s prompt tokens, %d were sent", self.url, report.prompt_tokens, len(prompt_ids)
            )
        ids = tuple(int(i) for i in output["output_ids"])
        return Sampled(ids, tuple(logprobs))


def _output(response: httpx.Response, url: str) -> dict[str, Any]:
    """The output dict of a ``/generate`` answer; SGLang's error answer (``{"error": {"message"}}``) raised."""
    try:
        payload = response.json()
    except ValueError as exc:
        raise EngineRequestError(
            f"the SGLang server at {url} answered /generate with {response.status_code} and a body that is not "
            f"JSON: {response.text[:200]!r}"
        ) from exc
    if response.status_code != 200 or not isinstance(payload, dict) or "error" in payload:
        error = payload.get("error") if isinstance(payload, dict) else None
        detail = error.get("message") if isinstance(error, dict) else payload
        raise EngineRequestError(f"the SGLang server at {url} refused /generate ({response.status_code}): {detail}")
    if not isinstance(payload.get("output_ids"), list) or not isinstance(payload.get("meta_info"), dict):
        raise EngineRequestError(
            f"the SGLang server at {url} answered /generate without 'output_ids' and 'meta_info' (keys: "
            f"{sorted(payload)}); is it SGLang's native server?"
        )
    return payload


def model_context(model_dir: str) -> int | None:
    """The context length in a model folder's config (``max_position_embeddings``; None when it has none), read
    without loading weights: the SGLang server serves the model, the gateway needs its tokenizer and limits."""
    from transformers import AutoConfig

    return getattr(AutoConfig.from_pretrained(model_dir), "max_position_embeddings", None)
