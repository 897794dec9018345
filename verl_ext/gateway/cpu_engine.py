"""The gateway's engine on CPU: verl_ext's CPU engine (``verl_ext.engines.cpu``) serving one local model folder.

One generation at a time (the model is not thread-safe), run in a worker thread so the server keeps answering.
``teacher_force`` is a TEST/DEMO hook, as the CPU engine's own: it names ids to force as a turn's first tokens
(a random model never writes a tool call); they are scored by the model like sampled ids. Never set it when the
tokens are meant for training.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

from verl_ext.core.errors import EngineRequestError
from verl_ext.gateway.engine import Sampled, Sampling

TeacherForce = Callable[[Sequence[int]], Sequence[int]]


class CPUEngine:
    """A transformers model from a local folder, sampled token by token on CPU (fp32 logprobs)."""

    unsupported_sampling = ("repetition_penalty",)  # verl_ext's CPU engine samples without a penalty

    def __init__(self, model_dir: str, *, seed: int = 0, teacher_force: TeacherForce | None = None) -> None:
        import torch

        from verl_ext.engines.cpu import eos_ids_of, load_model
        from verl_ext.engines.cpu_images import vision_of

        self.model = load_model(model_dir)
        self.vision = vision_of(model_dir, self.model.config)  # None for a text-only model
        self.takes_images = self.vision is not None
        self.eos_ids = frozenset(eos_ids_of(self.model))
        self.max_context: int | None = getattr(self.model.config, "max_position_embeddings", None)
        self._generator = torch.Generator().manual_seed(seed)
        self._lock = threading.Lock()  # held in the worker thread: any event loop, one generation at a time
        self.teacher_force = teacher_force

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling, images: Sequence[Any] = ()) -> Sampled:
        """Sample one turn; stops on ``sampling.stop_ids`` and the model's eos ids, which are kept in the output.
        ``images``: every image of the prompt in placeholder order (a VL model; never an image or video
        placeholder id is sampled)."""
        import torch

        from verl_ext.engines.cpu import SamplingConfig, generate_tokens

        config = SamplingConfig(
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            stop_ids=frozenset(sampling.stop_ids) | self.eos_ids,
            logprobs=True,
            seed=sampling.seed,
        )
        prompt = list(prompt_ids)
        forced = list(self.teacher_force(prompt)) if self.teacher_force else []
        if images and self.vision is None:
            raise EngineRequestError("the gateway's CPU engine got images, but the served model is text-only")
        if not images and self.vision is not None:
            self.vision.refuse_placeholders_without_images(prompt)
        vision = self.vision.inputs(prompt, list(images)) if images and self.vision is not None else None
        banned = self.vision.banned_ids if self.vision is not None else ()

        def run() -> Any:
            with self._lock:
                seeded = sampling.seed is not None
                generator = torch.Generator().manual_seed(sampling.seed) if seeded else self._generator
                return generate_tokens(
                    self.model,
                    prompt,
                    config,
                    forced_ids=forced,
                    generator=generator,
                    vision=vision,
                    banned_ids=banned,
                )

        out = await asyncio.to_thread(run)
        return Sampled(tuple(out.token_ids), tuple(out.log_probs))
