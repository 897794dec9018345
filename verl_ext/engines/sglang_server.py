"""verl_ext's SGLang rollout server: verl's ``SGLangHttpServer`` (a Ray actor) with a token-exact ``generate``.

Registered by the plugin for ``actor_rollout_ref.rollout.name=sglang``; what it checks and returns is described in
sglang_output.py. Importing this module imports verl's SGLang server, hence SGLang itself.
"""

from __future__ import annotations

import logging
from typing import Any

from verl_ext.engines.sglang_output import build_request, server_enabled, token_output_fields

log = logging.getLogger("verl_ext.engines")


def _server_base() -> type:
    from verl.workers.rollout.sglang_rollout.async_sglang_server import SGLangHttpServer

    return SGLangHttpServer


def _replica_base() -> type:
    from verl.workers.rollout.sglang_rollout.async_sglang_server import SGLangReplica

    return SGLangReplica


class TokenExactSGLangServer(_server_base()):  # type: ignore[misc]
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
        """verl's ``generate``, token-exact: one SGLang request built from the prompt ids, answered with the ids and
        logprobs SGLang sampled and its finish reason (see ``token_output_fields``). Requests verl_ext does not change
        (images, disaggregation, prompt logprobs, routing replay, LoRA adapters) go to verl's own ``generate``."""
        from sglang.srt.managers.io_struct import GenerateReqInput
        from verl.workers.rollout.replica import TokenOutput

        delegate = (
            image_data is not None
            or video_data is not None
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
        output = await self.tokenizer_manager.generate_request(GenerateReqInput(**request), None).__anext__()
        fields = token_output_fields(
            output,
            request_id=request_id,
            prompt_len=len(request["input_ids"]),
            max_new_tokens=request["sampling_params"]["max_new_tokens"],
            wants_logprobs=wants_logprobs,
            global_steps=self.global_steps,
        )
        return TokenOutput(**fields)

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        """verl 0.9.1's replica calls ``abort_all_requests(reject_request=...)`` but its SGLang server takes no
        argument (a TypeError on every partial-rollout abort). Same behaviour as verl's, with the argument accepted;
        SGLang 0.5.12 cannot reject new requests while paused, so ``reject_request`` is logged and ignored, as
        verl's replica documents for such backends."""
        if reject_request:
            log.warning("verl_ext SGLang server: reject_request=True is not supported by SGLang 0.5.12; ignored")
        await super().abort_all_requests()


class TokenExactSGLangReplica(_replica_base()):  # type: ignore[misc]
    """verl's ``SGLangReplica``, launching ``TokenExactSGLangServer`` when verl_ext is switched on."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        import ray

        super().__init__(*args, **kwargs)
        if server_enabled(self.config):
            self.server_class = ray.remote(TokenExactSGLangServer)
            log.info("verl_ext SGLang server on for replica %s", self.replica_rank)
