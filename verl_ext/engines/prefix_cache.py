"""The CPU engine's prefix cache: the keys and values of the last request, reused by the next request that extends
it (a multi-turn rollout's next prompt is the last prompt + output + the tool reply), as vLLM's and SGLang's prefix
caching do. Without it every turn of a long rollout re-reads the whole stream through the model (quadratic in the
turns); with it a turn feeds only its new ids.

One entry: a worker interleaving several rollouts keeps only the latest, and a request that shares less with it
crops the cache to what it shares (nothing shared: a fresh prefill). The cache is dropped when the weights change.
Logprobs agree with a full forward pass to fp32 rounding (the same attention over the same keys, summed in a
different order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class PrefixCache:
    """The ids whose keys and values ``past`` holds (a transformers ``Cache``), in order."""

    ids: list[int] = field(default_factory=list)
    past: Any = None

    def clear(self) -> None:
        """Forget the cached prefix (new weights, or the server is asked to free its cache)."""
        self.ids, self.past = [], None

    def take(self, prompt_ids: Sequence[int]) -> tuple[Any, int]:
        """The cache cropped to the longest prefix it shares with ``prompt_ids``, and that prefix's length; at
        least one prompt id is left to feed (the next token's logits come from it). ``(None, 0)``: nothing shared,
        prefill the whole prompt. The cache is emptied: the request extends what it took and ``keep``s it at its
        end, so a request that fails midway leaves no half-extended entry behind."""
        usable = min(len(self.ids), len(prompt_ids) - 1)
        shared = shared_prefix(self.ids, prompt_ids, usable) if self.past is not None else 0
        past = self.past
        self.clear()
        if shared == 0:
            return None, 0
        if past.get_seq_length() > shared:
            past.crop(shared)
        return past, shared

    def keep(self, fed_ids: list[int], past: Any) -> None:
        """After a request: ``past`` holds the keys and values of ``fed_ids`` (the prompt and every output id the
        model read, which is all but the last output id)."""
        self.ids, self.past = fed_ids, past


def shared_prefix(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    """How many leading ids ``a`` and ``b`` share, at most ``limit``: a list comparison first (the usual case, the
    next turn of the same rollout), a vectorised search for the first difference otherwise."""
    if limit <= 0:
        return 0
    if list(a[:limit]) == list(b[:limit]):
        return limit
    differs = torch.tensor(list(a[:limit])) != torch.tensor(list(b[:limit]))
    return int(torch.nonzero(differs)[0, 0])
