"""verl_ext's SGLang rollout server: verl's ``SGLangHttpServer`` (a Ray actor) with a token-exact ``generate``.

Registered by the plugin for ``actor_rollout_ref.rollout.name=sglang``; what it checks and returns is described in
sglang_output.py. Importing this module imports verl's SGLang server, hence SGLang itself.

Policy versions (``core.version_spans``). SGLang 0.5.12 knows no version of its own that verl sets (verl passes no
``weight_version`` to SGLang's weight updates: its ``meta_info["weight_version"]`` stays ``"default"``); verl's
server keeps the version as ``global_steps`` (``set_global_steps`` after each sync) and reads it when an output
returns. This server stamps each request with ``engine_stamps``: ``weight_version_at_dispatch`` is ``global_steps``
read before the request is handed to SGLang; ``weight_version_at_stop`` is, for an output aborted by
``abort_all_requests`` (a weight update's pause), the version serving when that abort was called (the one the
update replaces, whatever has been synced by the time the output is read back), else ``global_steps`` when the
output returns.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from verl_ext.core.version_spans import ABORT_REASONS, engine_stamps
from verl_ext.engines.forced_turn import SGLANG_FORCE_ENV, forced_generation, forced_prefix, scoring_request
from verl_ext.engines.sglang_images import (
    ImagePromptRebuildError,
    ban_placeholders,
    check_images_match_runs,
    compare_rebuild,
    image_list,
    not_rebuilt_by_legacy_path,
    placeholder_ids,
    refusal,
)
from verl_ext.engines.sglang_output import build_request, forced_switch, server_class_name, token_output_fields
from verl_ext.engines.sglang_scoring import input_scores, score_request

log = logging.getLogger("verl_ext.engines")


def _server_base() -> type:
    from verl.workers.rollout.sglang_rollout.async_sglang_server import SGLangHttpServer

    return SGLangHttpServer


def _replica_base() -> type:
    from verl.workers.rollout.sglang_rollout.async_sglang_server import SGLangReplica

    return SGLangReplica


class _VersionStamps:
    """The server's policy-version stamps (module docstring): what an abort saw, and a request's stamps."""

    _aborts = 0  # abort_all_requests calls so far
    _version_at_abort: Any = None  # global_steps when the last abort was called

    def _note_abort(self) -> None:
        self._version_at_abort = self.global_steps  # type: ignore[attr-defined]
        self._aborts += 1

    def _stamps(
        self, dispatched: Any, aborts_at_dispatch: int, stop_reason: Any, prompt_ids: list[int]
    ) -> dict[str, Any]:
        """``engine_stamps`` of a request sent on ``dispatched`` when ``aborts_at_dispatch`` aborts had been
        called, now that it returned with ``stop_reason``."""
        aborted = str(stop_reason) in ABORT_REASONS and self._aborts > aborts_at_dispatch
        stopped = self._version_at_abort if aborted else self.global_steps  # type: ignore[attr-defined]
        return engine_stamps(dispatched, stopped, prompt_ids)


class TokenExactSGLangServer(_VersionStamps, _server_base()):  # type: ignore[misc]
    """verl's SGLang server actor with the token-exact ``generate``; everything else inherited."""

    async def generate(
        self,
        prompt_ids: Any,
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
        bootstrap_host: str | None = None,
        bootstrap_port: int | None = None,
        bootstrap_room: int | None = None,
    ) -> Any:
        """verl's ``generate``, token-exact: one SGLang request built from the prompt ids (and the prompt's images,
        ``image_data``, one per placeholder run in order, as verl's server manager passes them), answered with the
        ids and logprobs SGLang sampled and its finish reason (see ``token_output_fields``). A request with images
        is sent only once SGLang's own rebuild of its ids is proven to give them back (``prove_image_prompt``); a
        multimodal model never samples an image or video placeholder (sglang_images.py). Requests verl_ext does not
        change (videos, disaggregation, prompt logprobs, routing replay, LoRA adapters) go to verl's own
        ``generate``."""
        from sglang.srt.managers.io_struct import GenerateReqInput
        from verl.workers.rollout.replica import TokenOutput

        delegate = (
            video_data is not None
            or bootstrap_room is not None
            or getattr(self, "_disaggregation_role", None) == "prefill"
            or "prompt_logprobs" in sampling_params
            or getattr(self.config, "enable_rollout_routing_replay", False)
            or getattr(self, "lora_as_adapter", False)
        )
        if delegate:  # paths verl_ext does not change: verl's own generate, as it is
            return await super().generate(
                prompt_ids,
                sampling_params,
                request_id,
                image_data=image_data,
                video_data=video_data,
                bootstrap_host=bootstrap_host,
                bootstrap_port=bootstrap_port,
                bootstrap_room=bootstrap_room,
            )
        request, wants_logprobs = build_request(
            request_id,
            list(prompt_ids),
            sampling_params,
            response_length=self.config.response_length,
            prompt_length=self.config.prompt_length,
            max_model_len=self.config.max_model_len,
        )
        mm_processor = getattr(self.tokenizer_manager, "mm_processor", None)
        if mm_processor is not None:  # a multimodal model: never sample a placeholder, with or without images
            ban_placeholders(request["sampling_params"], placeholder_ids(mm_processor))
        images = image_list(image_data)
        if images:
            request["image_data"] = images
            await prove_image_prompt(self.tokenizer_manager, GenerateReqInput(**request), mm_processor)
        dispatched, aborts = self.global_steps, self._aborts  # the version it is sent on: read before SGLang has it
        output = await self.tokenizer_manager.generate_request(GenerateReqInput(**request), None).__anext__()
        finish = (output.get("meta_info") or {}).get("finish_reason") or {}
        fields = token_output_fields(
            output,
            request_id=request_id,
            prompt_len=len(request["input_ids"]),
            max_new_tokens=request["sampling_params"]["max_new_tokens"],
            wants_logprobs=wants_logprobs,
            global_steps=self.global_steps,
            stamps=self._stamps(dispatched, aborts, finish.get("type"), list(request["input_ids"])),
        )
        return TokenOutput(**fields)

    async def score(self, ids: list[int], start: int, temperature: float = 1.0) -> dict[str, Any]:
        """The scoring path (the re-feed audit's, sglang_scoring.py): SGLang's input logprobs of ``ids[start:]``
        after the ids before it, from one prefill request through SGLang's own request path; ``ids`` as SGLang
        reported them, ``global_steps`` and SGLang's ``weight_version`` the weights that scored them."""
        from uuid import uuid4

        from sglang.srt.managers.io_struct import GenerateReqInput

        ids = [int(i) for i in ids]
        fields = score_request(f"verl-ext-score-{uuid4().hex}", ids, int(start), temperature)
        output = await self.tokenizer_manager.generate_request(GenerateReqInput(**fields), None).__anext__()
        scored_ids, logprobs = input_scores(output, len(ids) - int(start))
        meta = output.get("meta_info") or {}
        return {
            "ids": scored_ids,
            "logprobs": logprobs,
            "global_steps": self.global_steps,
            "weight_version": meta.get("weight_version"),
        }

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        """verl 0.9.1's replica calls ``abort_all_requests(reject_request=...)`` but its SGLang server takes no
        argument (a TypeError on every partial-rollout abort). Same behaviour as verl's, with the argument accepted;
        SGLang 0.5.12 cannot reject new requests while paused, so ``reject_request`` is logged and ignored, as
        verl's replica documents for such backends."""
        if reject_request:
            log.warning("verl_ext SGLang server: reject_request=True is not supported by SGLang 0.5.12; ignored")
        self._note_abort()  # before SGLang returns the aborted outputs: the version they stopped on
        await super().abort_all_requests()


async def prove_image_prompt(tokenizer_manager: Any, request: Any, mm_processor: Any) -> None:
    """Run SGLang's own rebuild of an image request's prompt ids (its multimodal processor, called as its
    tokenizer manager calls it) and refuse the request unless it gives back exactly the ids sent
    (``ImagePromptRebuildError``; see sglang_images.py). Costs one more pass of SGLang's image processor over
    the request's images."""
    if mm_processor is None:
        raise ImagePromptRebuildError(
            "verl_ext SGLang server: the request holds images but SGLang serves this model as text-only (it has "
            "no multimodal processor for it); serve a vision-language model, or send no images"
        )
    refused = not_rebuilt_by_legacy_path(tokenizer_manager.server_args)
    if refused is not None:
        raise refused
    ids = list(request.input_ids)
    check_images_match_runs(ids, request.image_data, getattr(mm_processor.mm_tokens, "image_token_id", None))
    try:
        rebuilt = await mm_processor.process_mm_data_async(
            image_data=list(request.image_data),
            input_text=list(ids),
            request_obj=request,
            max_req_input_len=getattr(tokenizer_manager, "max_req_input_len", None),
        )
    except Exception as exc:  # SGLang would fail the same way on the request itself: say so before sending it
        raise ImagePromptRebuildError(
            f"verl_ext SGLang server: request {request.rid}: SGLang's multimodal processor cannot rebuild this image "
            f"prompt ({type(exc).__name__}: {exc}); check that every image decodes and that the prompt holds one "
            "vision block per image, as the model's chat template writes it"
        ) from exc
    tokenizer = getattr(mm_processor, "_tokenizer", None)
    check = compare_rebuild(
        ids, list(rebuilt.input_ids), getattr(tokenizer, "decode", None), placeholder_ids(mm_processor)
    )
    if not check.exact:
        raise refusal(request.rid, check)


class _ForcedFirstTurn:
    """TEST/DEMO ONLY (forced_turn.py): a trajectory's first turn is the text in ``VERL_EXT_SGLANG_FORCE_FIRST_TURN``,
    scored by SGLang (its logprobs are the model's); every other request goes to the server's own ``generate``."""

    _force_ids: list[int] | None = None

    def _forced_ids(self) -> list[int]:
        if self._force_ids is None:
            text = os.environ.get(SGLANG_FORCE_ENV) or ""
            tokenizer = self.model_config.tokenizer  # type: ignore[attr-defined]
            self._force_ids = tokenizer.encode(text, add_special_tokens=False) if text else []
            log.warning(
                "verl_ext SGLang server: TEST/DEMO hook %s set: forcing %d tokens as every trajectory's first turn",
                SGLANG_FORCE_ENV,
                len(self._force_ids),
            )
        return self._force_ids

    async def generate(self, prompt_ids: Any, sampling_params: dict[str, Any], request_id: str, **kw: Any) -> Any:
        forced = forced_prefix([int(i) for i in prompt_ids], self._forced_ids())
        other = any(kw.get(k) is not None for k in ("image_data", "video_data", "bootstrap_room"))
        if not forced or other or "prompt_logprobs" in sampling_params:
            return await super().generate(prompt_ids, sampling_params, request_id, **kw)  # type: ignore[misc]
        return await self._generate_forced(list(prompt_ids), dict(sampling_params), request_id, forced)

    async def _generate_forced(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], request_id: str, forced: list[int]
    ) -> Any:
        from sglang.srt.managers.io_struct import GenerateReqInput

        request, wants_logprobs = build_request(
            request_id,
            prompt_ids,
            sampling_params,
            response_length=self.config.response_length,  # type: ignore[attr-defined]
            prompt_length=self.config.prompt_length,  # type: ignore[attr-defined]
            max_model_len=self.config.max_model_len,  # type: ignore[attr-defined]
        )
        scoring = GenerateReqInput(**scoring_request(request_id, prompt_ids, forced))
        dispatched = self.global_steps  # type: ignore[attr-defined]
        scored = await self.tokenizer_manager.generate_request(scoring, None).__anext__()  # type: ignore[attr-defined]
        budget = request["sampling_params"]["max_new_tokens"]
        output = forced_generation(scored, len(prompt_ids), forced, budget)
        return self._forced_output(output, request_id, prompt_ids, budget, wants_logprobs, dispatched)

    def _forced_output(
        self,
        output: dict[str, Any],
        request_id: str,
        prompt_ids: list[int],
        budget: int,
        wants_logprobs: bool,
        dispatched: Any,
    ) -> Any:
        """verl's ``TokenOutput`` for the forced turn, as verl's own server builds one from an SGLang output."""
        from verl.workers.rollout.replica import TokenOutput

        ids = list(output["output_ids"])
        logprobs = [float(e[0]) for e in output["meta_info"]["output_token_logprobs"]]
        return TokenOutput(
            token_ids=ids,
            log_probs=logprobs if wants_logprobs else None,
            stop_reason=output["meta_info"]["finish_reason"]["type"],
            extra_fields={"global_steps": self.global_steps},  # type: ignore[attr-defined]
        )


class ForcedFirstTurnStockSGLangServer(_ForcedFirstTurn, _server_base()):  # type: ignore[misc]
    """TEST/DEMO ONLY: verl's stock SGLang server with the forced first turn (a comparison arm on a random model)."""


class ForcedFirstTurnTokenExactSGLangServer(_ForcedFirstTurn, TokenExactSGLangServer):
    """TEST/DEMO ONLY: verl_ext's SGLang server with the forced first turn; the forced output goes through the
    same checks and report as a sampled one."""

    def _forced_output(
        self,
        output: dict[str, Any],
        request_id: str,
        prompt_ids: list[int],
        budget: int,
        wants_logprobs: bool,
        dispatched: Any,
    ) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        fields = token_output_fields(
            output,
            request_id=request_id,
            prompt_len=len(prompt_ids),
            max_new_tokens=budget,
            wants_logprobs=wants_logprobs,
            global_steps=self.global_steps,
            stamps=engine_stamps(dispatched, self.global_steps, prompt_ids),  # a forced turn is never aborted
        )
        return TokenOutput(**fields)


def server_class_for(enabled: bool) -> type | None:
    """The server class a replica launches (``server_class_name``: verl_ext's when ``enabled``); ``None`` keeps
    verl's own."""
    name = server_class_name(enabled)
    return None if name is None else globals()[name]


def _environment_switch(rollout_config: Any) -> bool:
    """The switch without the plugin's loop rule: on only where ``VERL_EXT_SGLANG_SERVER`` forces it."""
    return forced_switch() is True


class TokenExactSGLangReplica(_replica_base()):  # type: ignore[misc]
    """verl's ``SGLangReplica``, launching ``TokenExactSGLangServer`` when verl_ext is switched on (and a
    forced-first-turn server when the TEST/DEMO hook is set, see ``server_class_for``)."""

    # Whether verl_ext's server is on for a rollout config: which loop runs decides, and that is plugin policy, so the
    # plugin sets this when it registers the replica (verl_ext.plugin.register_sglang_rollout); alone, this layer
    # follows VERL_EXT_SGLANG_SERVER only.
    server_switch: Callable[[Any], bool] = staticmethod(_environment_switch)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        import ray

        super().__init__(*args, **kwargs)
        server_class = server_class_for(type(self).server_switch(self.config))
        if server_class is not None:
            self.server_class = ray.remote(server_class)
            log.info("verl_ext SGLang server: replica %s launches %s", self.replica_rank, server_class.__name__)
