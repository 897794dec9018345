"""What the gateway needs from an engine: token ids in, sampled ids and their logprobs out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Sampling:
    """One generate call's parameters (``temperature`` 0 is greedy; ``stop_ids`` end the turn, kept in the output)."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_ids: tuple[int, ...] = ()
    top_k: int = -1  # -1: no top-k cut
    repetition_penalty: float = 1.0


# A request's sampling option at its default asks nothing of the engine (``Engine.unsupported_sampling``).
SAMPLING_DEFAULTS: dict[str, object] = {"top_k": None, "repetition_penalty": 1.0}


@dataclass(frozen=True)
class Sampled:
    """What the engine returned: the ids as sampled (a stop id kept), one logprob per id; ``images``: the images it
    passed on with the call, as it passed them (None: it does not say, and the gateway records the list it handed
    the engine). The engine call's record keeps their digests. ``segments``: the engine calls (attempts) the turn
    took, for the record's versions."""

    token_ids: tuple[int, ...]
    log_probs: tuple[float, ...] | None
    images: tuple[Any, ...] | None = None
    # the engine calls the turn took, one segment each (verl_ext.core.version_spans: the version each was sent on,
    # its place): two or more where a weight update aborted the turn and it was resumed. None: the engine does not say
    segments: tuple[Mapping[str, Any], ...] | None = None
    # the weight label the engine served the turn on (verl's ``global_steps``, for the record's ``trainer`` entry);
    # None: the engine gives none (the standalone gateway's engines)
    label: Any = None


class Engine(Protocol):
    """A token-in/token-out engine. ``max_context`` is the longest prompt + output it serves (None: no limit).
    An engine may name sampling options it cannot honour in ``unsupported_sampling`` (a request setting one gets a
    400 naming it before anything changes). An engine whose sampling settings a trainer decides (verl's rollout
    ``temperature``, ``top_p``, ``top_k``: the policy is trained on what it samples at those) has
    ``decided_sampling(session_id) -> {name: value}``, the settings it samples that session with whatever a request
    asks (a setting it does not pass, such as a seed, is None); the gateway serves the request and says in the answer
    which of its settings were overridden (``Completion.sampling_overridden``)."""

    max_context: int | None

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Sampled:
        """Sample one assistant turn after ``prompt_ids``. An engine that serves a vision-language model also
        takes ``images=[...]`` (every image of the prompt, in placeholder order), and says so with
        ``takes_images = True``; the gateway passes the keyword only for a prompt that holds images."""
        ...
