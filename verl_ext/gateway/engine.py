"""What the gateway needs from an engine: token ids in, sampled ids and their logprobs out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Sampling:
    """One generate call's parameters (``temperature`` 0 is greedy; ``stop_ids`` end the turn, kept in the output)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Sampled:
    """What the engine returned: the ids as sampled (a stop id kept), one logprob per id."""

    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...] | None


class Engine(Protocol):
    """A token-in/token-out engine. ``max_context`` is the longest prompt + output it serves (None: no limit)."""

    max_context: int | None

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Sampled:
        """Sample one assistant turn after ``prompt_ids``."""
        ...
