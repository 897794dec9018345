"""The gateway's engine on a running SGLang server: its native ``POST /generate`` with ``input_ids`` and
``return_logprob``, read as verl_ext's SGLang rollout server reads SGLang's output (``verl_ext.engines.sglang_output``).

Token in, token out: the prompt is the session's ids, the answer the ids SGLang sampled (the stop token kept) with
their logprobs. What the rollout server checks is checked here too (the logprob entries' ids equal the output ids,
their counts agree), but an output that fails the check, an aborted request or an error answer is an error naming
it (the gateway ends the session with ``engine_error`` and records what it holds): the engine broke its contract,
and a gateway call has no partial sample to fall back on. Works with a server launched with or without
``--skip-tokenizer-init`` (its ``text`` is not read).

Images (a vision-language model; the engine holds the model's processor): SGLang 0.5.12 rebuilds the prompt ids of
a request with images from their decoded text (verl_ext/engines/sglang_images.py). The engine sends each image as a
PNG data URL (lossless: SGLang decodes the pixels the client sent) and the ids with each placeholder run written
once, the form SGLang's processor expands on both of its paths (with or without ``--skip-tokenizer-init``). Before
sending, it runs that rebuild itself with the model's processor (decode the collapsed ids, the processor on the
text and the images) and refuses, with an error naming the cause, a prompt it does not give back exactly (a
non-canonical tokenization, or an image the processor expands otherwise); after, SGLang's prompt token count must
be the prompt's (SGLang's own image settings could differ from the folder's). A multimodal model never samples an
image or video placeholder id: SGLang's ``logit_bias`` bans them (a large finite bias: JSON has no infinity).
"""

from __future__ import annotations

import base64
import io
import logging
import uuid
from collections.abc import Sequence
from typing import Any

import httpx

from verl_ext.core.errors import EngineRequestError
from verl_ext.engines.sglang_images import (
    ban_placeholders,
    check_images_match_runs,
    collapse_runs,
    compare_rebuild,
    refusal,
)
from verl_ext.engines.sglang_output import ABORT_REASONS, build_request, engine_report
from verl_ext.gateway.engine import Sampled, Sampling

log = logging.getLogger("verl_ext.gateway")


BANNED_OVER_HTTP = -1e9  # SGLang adds it to the logits: exp() of it is 0 (JSON cannot carry -inf)
GATEWAY_REFUSES = "The gateway refuses the request (engine_error) rather than record logprobs of other tokens."


class SGLangEngine:
    """A running SGLang server at ``url`` (``http://host:port``). ``max_context`` is the model's context length
    (prompt + output; None: SGLang's own limit applies). ``processor``: the served model's processor, for a
    vision-language model (its images are proven before sending; without it, a request with images is refused)."""

    takes_images = True  # with ``processor``; the gateway passes images only when it has the model's image side

    def __init__(
        self, url: str, *, max_context: int | None = None, timeout_s: float = 600.0, processor: Any = None
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise EngineRequestError(f"the SGLang server URL must start with http:// or https://, got {url!r}")
        self.url = url.rstrip("/")
        self.max_context = max_context
        self.timeout_s = timeout_s
        self.processor = processor
        ids = (getattr(processor, "image_token_id", None), getattr(processor, "video_token_id", None))
        self.placeholders = tuple(sorted({int(i) for i in ids if i is not None}))

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

    def request(self, prompt_ids: Sequence[int], sampling: Sampling, images: Sequence[Any] = ()) -> dict[str, Any]:
        """The ``/generate`` body: ``input_ids``, SGLang's sampling parameters (the placeholder ban for a VL
        model), ``return_logprob``; with images, ``image_data`` (PNG data URLs in placeholder order) and the ids
        with each placeholder run written once."""
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
        if self.placeholders:
            ban_placeholders(body["sampling_params"], self.placeholders)
            bias = body["sampling_params"]["logit_bias"]
            bias.update({str(i): BANNED_OVER_HTTP for i in self.placeholders})
        if images:
            body["input_ids"] = collapse_runs(body["input_ids"], self.placeholders)
            body["image_data"] = [png_data_url(image) for image in images]
        return body

    def prove_images(self, prompt_ids: Sequence[int], images: Sequence[Any]) -> None:
        """SGLang's rebuild of an image prompt, run here with the model's processor (decode the collapsed ids, the
        processor on that text and the images, as SGLang's multimodal processor does): raises
        ``ImagePromptRebuildError`` unless it gives back exactly ``prompt_ids``."""
        if self.processor is None:
            raise EngineRequestError(
                "the gateway's SGLang engine got images but has no processor of the served model to prove their "
                "prompt with; build it with SGLangEngine(url, processor=...) (verl-ext gateway does, from a model "
                "folder holding preprocessor_config.json)"
            )
        ids = [int(i) for i in prompt_ids]
        check_images_match_runs(ids, images, getattr(self.processor, "image_token_id", None))
        text = self.processor.tokenizer.decode(collapse_runs(ids, self.placeholders))
        out = self.processor(text=[text], images=list(images), return_tensors="np")
        rebuilt = [int(i) for i in out["input_ids"][0]]
        check = compare_rebuild(ids, rebuilt, self.processor.tokenizer.decode, self.placeholders)
        if not check.exact:
            raise refusal("gateway", check, GATEWAY_REFUSES)

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling, images: Sequence[Any] = ()) -> Sampled:
        """One ``/generate`` call (with the prompt's images, in placeholder order, for a VL model); raises
        EngineRequestError for an image prompt SGLang would rebuild to other ids, an error answer, an abort, or
        ids the logprobs do not cover."""
        if images:
            self.prove_images(prompt_ids, images)
        body = self.request(prompt_ids, sampling, images)
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
        if report.prompt_tokens is not None and int(report.prompt_tokens) != len(prompt_ids):
            if images:  # SGLang expanded an image otherwise than the model folder's processor: other positions
                raise EngineRequestError(
                    f"the SGLang server at {self.url} ran the image prompt as {report.prompt_tokens} tokens where the "
                    f"session holds {len(prompt_ids)}: its image settings (--mm-process-config, the model folder's "
                    "preprocessor_config.json) differ from the processor the gateway expanded the images with; "
                    "serve the same model folder with the same settings"
                )
            log.warning(
                "SGLang at %s counted %s prompt tokens, %d were sent", self.url, report.prompt_tokens, len(prompt_ids)
            )
        ids = tuple(int(i) for i in output["output_ids"])
        return Sampled(ids, tuple(logprobs))


def png_data_url(image: Any) -> str:
    """An image (PIL) as a PNG data URL, which SGLang's image loader decodes back to the same pixels."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


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
