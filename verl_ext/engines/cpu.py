"""A CPU rollout backend for verl 0.9.1: ``actor_rollout_ref.rollout.name=verl_ext_cpu``.

A transformers causal LM served token-in/token-out by a Ray actor, so verl's agent loops and trainer run on a machine
without an accelerator (tests, demos; not for production speed). Three parts, as verl needs them:

* ``CPUGenerationServer``: the Ray actor. ``generate(prompt_ids, sampling_params, request_id, ...) -> TokenOutput``,
  one generation at a time (an asyncio lock; the model is not thread-safe), and ``update_weights`` from the trainer.
* ``CPURolloutReplica``: the driver-side replica verl's ``LLMServerManager`` creates; it launches one server actor.
* ``CPUServerAdapter``: the worker-side ``BaseRollout`` in the trainer process; it ships the trainer's weights to
  the server every step.

Output contract, matching vLLM's server in verl: ``token_ids`` are the sampled ids *with* the stop token kept,
``log_probs`` (when ``sampling_params["logprobs"]`` is true) are the log-probabilities of those ids under the
sampling distribution (logits / temperature, in fp32; greedy uses temperature 1), ``extra_fields`` carries
``global_steps`` and verl_ext's engine report. ``stop_reason`` is the finish reason, ``"stop"``, ``"length"`` or
``"aborted"`` (verl treats anything but ``"aborted"`` as finished; vLLM folds the first two into ``"completed"``,
which loses the truncation signal).

TEST/DEMO ONLY: ``VERL_EXT_CPU_FORCE_FIRST_TURN`` (see ``FORCE_ENV``) holds a text, e.g. a tool call ending in
``<|im_end|>``. It is tokenized and teacher-forced as the first assistant turn of every trajectory (any request whose
prompt does not already contain it), because a random model never calls a tool. The logprobs of the forced tokens
are still the model's. Never set it in a real run: the "sampled" tokens of that turn are then not the policy's.

TEST ONLY: ``rollout.engine_kwargs.verl_ext_cpu.faults`` injects faults in the reported logprobs or the weights
served (cpu_faults.py), to prove the numerics view localizes them, or parks a request until verl's abort
(``abort_after``: a partial rollout on cue); ``truth_log`` writes the version that generated each request's ids.

Partial rollouts (verl's async trainers): ``abort_all_requests`` stops the request in flight between two ids and
returns it ``"aborted"`` with its logprobs; requests wait out the pause until ``resume_generation``; the engine report
(``extra_fields["verl_ext_engine"]``) stamps the version each request was generated on (cpu_pause.py).

``score`` is the engine's scoring path (a prefill of given ids, their logprobs), used by the re-feed audit.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import ray
import torch
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutReplica, TokenOutput
from verl.workers.rollout.utils import ensure_async_iterator

from verl_ext.core.errors import EngineRequestError, OptionsError
from verl_ext.core.version_spans import engine_stamps
from verl_ext.engines.cpu_faults import CallNumbers, Fault, parse_faults, perturbed
from verl_ext.engines.cpu_images import VisionInputs, ban, vision_of
from verl_ext.engines.cpu_pause import ABORTED, GenerationGate, ParkPlan, TruthLog
from verl_ext.engines.forced_turn import contains_subsequence, forced_prefix  # noqa: F401 - the hook lives there
from verl_ext.engines.prefix_cache import PrefixCache
from verl_ext.engines.sglang_output import ENGINE_FIELD

logger = logging.getLogger(__name__)

FORCE_ENV = "VERL_EXT_CPU_FORCE_FIRST_TURN"
SERVER_NAME_PREFIX = "verl_ext_cpu_server_"
ENGINE_KWARGS_KEY = "verl_ext_cpu"  # rollout.engine_kwargs.<this>: the CPU engine's own options
_ENGINE_OPTIONS = frozenset({"faults", "truth_log"})

# sampling_params keys verl's agent loops send (agent_loop.py, tool_agent_loop.py); anything else is refused loudly.
_KNOWN_PARAMS = frozenset(
    {
        "max_tokens",
        "max_new_tokens",
        "temperature",
        "top_p",
        "top_k",
        "stop_token_ids",
        "logprobs",
        "repetition_penalty",
        "ignore_eos",
        "seed",
    }
)


# --------------------------------------------------------------------------------------------------------------------
# Generation: plain torch + transformers, testable without a Ray cluster.
# --------------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplingConfig:
    """What one ``generate`` call samples with. ``temperature == 0`` means greedy."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_ids: frozenset[int] = frozenset()
    logprobs: bool = True
    seed: int | None = None


@dataclass
class Generation:
    """The engine's output for one request."""

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: str  # "stop" (ended on a stop id, kept in token_ids) or "length"
    num_forced: int = 0  # leading tokens that were teacher-forced (test/demo hook), not sampled
    extra: dict[str, Any] = field(default_factory=dict)


def sampling_config_from_params(
    params: dict[str, Any],
    *,
    default_max_tokens: int,
    eos_ids: Iterable[int],
) -> SamplingConfig:
    """Build a SamplingConfig from verl's ``sampling_params`` dict (vLLM-style keys).

    ``max_tokens`` (or SGLang's ``max_new_tokens``) wins over ``default_max_tokens``. The stop ids are
    ``stop_token_ids`` plus the model's eos ids unless ``ignore_eos``, as vLLM does.
    """
    unknown = set(params) - _KNOWN_PARAMS
    if unknown:
        raise EngineRequestError(f"verl_ext_cpu: unsupported sampling_params {sorted(unknown)}")
    repetition_penalty = float(params.get("repetition_penalty") or 1.0)
    if repetition_penalty != 1.0:
        raise EngineRequestError(f"verl_ext_cpu: repetition_penalty={repetition_penalty} is not supported (only 1.0)")
    max_tokens = params.get("max_tokens", params.get("max_new_tokens", default_max_tokens))
    if max_tokens is None or int(max_tokens) < 1:
        raise EngineRequestError(f"verl_ext_cpu: max_tokens must be >= 1, got {max_tokens!r}")
    top_k = params.get("top_k")
    stop_ids = {int(i) for i in params.get("stop_token_ids") or ()}
    if not params.get("ignore_eos", False):
        stop_ids |= {int(i) for i in eos_ids}
    return SamplingConfig(
        max_tokens=int(max_tokens),
        temperature=float(params.get("temperature", 1.0) if params.get("temperature") is not None else 1.0),
        top_p=float(params.get("top_p") if params.get("top_p") is not None else 1.0),
        top_k=int(top_k) if top_k is not None else -1,
        stop_ids=frozenset(stop_ids),
        logprobs=bool(params.get("logprobs", False)),
        seed=int(params["seed"]) if params.get("seed") is not None else None,
    )


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to -inf) what top-k / top-p exclude from a 1-D logits vector; the input is not modified."""
    out = logits.clone()
    if 0 < top_k < out.numel():
        kth = torch.topk(out, top_k).values[-1]
        out[out < kth] = float("-inf")
    if top_p < 1.0:
        sorted_logits, order = torch.sort(out, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # drop a token once the mass *before* it already reaches top_p; the top token always survives
        drop = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
        out[order[drop]] = float("-inf")
    return out


def choose_token(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None) -> int:
    """Pick the next id from fp32 logits: argmax when greedy, else a sample after temperature, top-k, top-p."""
    if cfg.temperature == 0:
        return int(torch.argmax(logits))
    filtered = filter_logits(logits / cfg.temperature, cfg.top_k, cfg.top_p)
    probs = torch.softmax(filtered, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))


def token_logprob(logits: torch.Tensor, token_id: int, temperature: float) -> float:
    """log p(token) under logits / temperature in fp32 (temperature 0, greedy, is scored at temperature 1)."""
    scale = temperature if temperature > 0 else 1.0
    return float(torch.log_softmax(logits.float() / scale, dim=-1)[token_id])


@torch.no_grad()
def generate_tokens(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    cfg: SamplingConfig,
    *,
    forced_ids: Sequence[int] = (),
    generator: torch.Generator | None = None,
    vision: VisionInputs | None = None,
    banned_ids: Sequence[int] = (),
    prefix_cache: PrefixCache | None = None,
    should_stop: Callable[[int], bool] | None = None,
) -> Generation:
    """Generate from ``prompt_ids`` one token at a time with a KV cache.

    ``forced_ids`` (test/demo hook) replace the first sampling steps; they are scored like sampled tokens and a stop
    id among them ends the turn. On a text request they are known in advance, so they are read in the prompt's
    forward pass (the logits after each prompt-or-forced id score the next forced id, as a teacher-forced pass scores
    them), not one pass per id; a VL request's token types cover the prompt alone, so there they are read one pass
    each. A stop id is kept in the output. Logprobs are in fp32 whatever the model dtype.
    ``prefix_cache``: the previous request's keys and values, reused for the prefix this prompt shares with it and
    left holding this request's (text only: a request with images prefills everything and empties it).
    ``should_stop(ids so far)`` is asked before each sampled id: True stops there, finish reason ``"aborted"`` (verl's
    abort, cpu_pause.py), the ids and logprobs so far returned.
    """
    if not prompt_ids:
        raise EngineRequestError("verl_ext_cpu: empty prompt")
    device = next(model.parameters()).device
    past, shared = None, 0
    if prefix_cache is not None and vision is None:
        past, shared = prefix_cache.take(prompt_ids)
    forced = forced_run(forced_ids, cfg)
    folded = forced if vision is None else []  # forced ids read in the prefill
    images = {} if vision is None else dict(vars(vision))  # a VL model's pixels, grids and token types
    keep = max(1, len(folded))  # one row per folded forced id (row j scores folded[j]), else the prompt's last
    input_ids = torch.tensor([[*prompt_ids[shared:], *folded[:-1]]], dtype=torch.long, device=device)
    out = model(input_ids=input_ids, past_key_values=past, use_cache=True, logits_to_keep=keep, **images)
    rows = out.logits[0, -keep:].float()
    if banned_ids:
        rows[:, list(banned_ids)] = float("-inf")
    step = _Stepper(model, out.past_key_values, banned_ids, device)
    finish_reason = "stop" if forced and forced[-1] in cfg.stop_ids else "length"
    more = finish_reason == "length" and len(forced) < cfg.max_tokens  # sampling goes on after the forced ids
    log_probs = _scores(rows, folded, cfg.temperature) if folded and cfg.logprobs else []
    logits = step(folded[-1]) if folded and more else rows[-1]  # a pass only where a next id is wanted
    token_ids: list[int] = list(folded)
    for token in forced[len(folded) :]:  # a VL request's forced ids, one pass each
        log_probs += [token_logprob(logits, token, cfg.temperature)] if cfg.logprobs else []
        token_ids.append(token)
        if len(token_ids) < len(forced) or more:
            logits = step(token)
    while finish_reason == "length" and len(token_ids) < cfg.max_tokens:
        if should_stop is not None and should_stop(len(token_ids)):
            finish_reason = "aborted"
            break
        token = choose_token(logits, cfg, generator)
        token_ids.append(token)
        if cfg.logprobs:
            log_probs.append(token_logprob(logits, token, cfg.temperature))
        if token in cfg.stop_ids:
            finish_reason = "stop"
        elif len(token_ids) < cfg.max_tokens:
            logits = step(token)
    if prefix_cache is not None and (vision is not None or finish_reason == "aborted"):
        prefix_cache.clear()  # an aborted request's cache has read every output id: not the layout keep() takes
    elif prefix_cache is not None:  # the model has read the prompt and every output id but the last
        prefix_cache.keep([*prompt_ids, *token_ids[:-1]], step.past)
    return Generation(token_ids=token_ids, log_probs=log_probs, finish_reason=finish_reason, num_forced=len(forced))


class _Stepper:
    """One decoding step: feed one id through the model on its KV cache (``past``), return the next logits."""

    def __init__(self, model: torch.nn.Module, past: Any, banned_ids: Sequence[int], device: torch.device) -> None:
        self.model, self.past, self.banned_ids, self.device = model, past, banned_ids, device

    def __call__(self, token: int) -> torch.Tensor:
        ids = torch.tensor([[token]], dtype=torch.long, device=self.device)
        out = self.model(input_ids=ids, past_key_values=self.past, use_cache=True)
        self.past = out.past_key_values
        return ban(out.logits[0, -1].float(), self.banned_ids)


def _scores(rows: torch.Tensor, forced: Sequence[int], temperature: float) -> list[float]:
    """The logprob of each forced id under its row (row j scores forced[j]), as ``token_logprob`` scores one."""
    scale = temperature if temperature > 0 else 1.0
    scores = torch.log_softmax(rows / scale, dim=-1)
    return scores.gather(1, torch.tensor(list(forced), device=scores.device)[:, None])[:, 0].tolist()


@torch.no_grad()
def score_tokens(model: torch.nn.Module, ids: Sequence[int], start: int, temperature: float = 1.0) -> list[float]:
    """The scoring path: one prefill forward over ``ids`` (no KV cache, no sampling) and the logprob of each of
    ``ids[start:]`` given the ids before it, under logits / temperature in fp32 (temperature 0 scores at 1, as
    generation reports greedy tokens)."""
    if not 0 < start < len(ids):
        raise EngineRequestError(
            f"verl_ext_cpu: score needs 0 < start < len(ids) (a context and at least one id to score), got start "
            f"{start} for {len(ids)} ids"
        )
    device = next(model.parameters()).device
    out = model(input_ids=torch.tensor([[int(i) for i in ids]], dtype=torch.long, device=device), use_cache=False)
    rows = out.logits[0, start - 1 : len(ids) - 1].float()  # row j predicts ids[start + j]
    return _scores(rows, [int(i) for i in ids[start:]], temperature)


def engine_options(engine_kwargs: Any) -> dict[str, Any]:
    """``rollout.engine_kwargs.verl_ext_cpu`` as a plain dict (empty when unset); an unknown key is refused."""
    from omegaconf import OmegaConf  # verl's config library: engine_kwargs arrives as a DictConfig or a dict

    raw = engine_kwargs.get(ENGINE_KWARGS_KEY) if engine_kwargs else None
    if raw is None:
        return {}
    raw = OmegaConf.to_container(raw, resolve=True) if OmegaConf.is_config(raw) else raw
    if not isinstance(raw, dict):
        raise OptionsError(f"rollout.engine_kwargs.{ENGINE_KWARGS_KEY} must be a mapping, got {raw!r}")
    unknown = sorted(set(raw) - _ENGINE_OPTIONS)
    if unknown:
        raise OptionsError(
            f"rollout.engine_kwargs.{ENGINE_KWARGS_KEY}: unknown keys {unknown}; the CPU engine takes "
            f"{sorted(_ENGINE_OPTIONS)}"
        )
    return dict(raw)


def forced_run(forced_ids: Sequence[int], cfg: SamplingConfig) -> list[int]:
    """The forced ids this request emits: cut at ``max_tokens``, and just after the first stop id (it ends the
    turn)."""
    forced = [int(i) for i in forced_ids][: cfg.max_tokens]
    stop = next((k for k, token in enumerate(forced) if token in cfg.stop_ids), None)
    return forced if stop is None else forced[: stop + 1]


def load_model(path: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """Load the served model from a local Hugging Face folder, in eval mode (fp32 by default: exact logprobs)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    vl = getattr(AutoConfig.from_pretrained(path), "image_token_id", None) is not None  # a vision-language model
    auto = AutoModelForImageTextToText if vl else AutoModelForCausalLM
    model = auto.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
    model.eval()
    return model


def eos_ids_of(model: torch.nn.Module) -> list[int]:
    """The model's eos ids (generation config first, then model config); an engine stops on these by default."""
    for config in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        eos = getattr(config, "eos_token_id", None) if config is not None else None
        if eos is not None:
            return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    return []


@torch.no_grad()
def load_weights(model: torch.nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> int:
    """Copy ``(name, tensor)`` pairs from the trainer into ``model``; return how many tensors were loaded.

    Raises if a name is unknown, a shape differs, or a parameter received nothing (tied parameters count as covered
    through any of their names), so a silently partial sync cannot happen.
    """
    targets = dict(model.state_dict(keep_vars=True))
    covered: set[int] = set()
    loaded = 0
    unknown: list[str] = []
    for name, tensor in weights:
        if hasattr(tensor, "full_tensor"):  # a DTensor shard from FSDP2
            tensor = tensor.full_tensor()
        target = targets.get(name)
        if target is None:
            unknown.append(name)
            continue
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(f"verl_ext_cpu: shape mismatch for {name}: {tuple(tensor.shape)} vs {tuple(target.shape)}")
        target.data.copy_(tensor.to(device=target.device, dtype=target.dtype))
        covered.add(id(target))
        loaded += 1
    # tied parameters are one Parameter object under several names: covered if any of its names was sent
    missing = [n for n, p in model.named_parameters() if id(p) not in covered]
    if unknown or missing:
        raise ValueError(f"verl_ext_cpu: weight sync mismatch: unknown keys {unknown[:10]}, missing {missing[:10]}")
    return loaded


def default_max_tokens(prompt_len: int, prompt_length: int, response_length: int, max_model_len: int | None) -> int:
    """vLLM's default in verl when a caller sends no ``max_tokens``: the response budget, capped by the context left.

    verl's stock ToolAgentLoop sends none, so on later turns this over-estimates what is left of ``response_length``
    (the loop truncates the excess); pass ``max_tokens`` per turn to avoid generating tokens that are thrown away.
    """
    budget = min(response_length, prompt_length + response_length - prompt_len)
    if max_model_len:
        budget = min(budget, max_model_len - prompt_len)
    return max(1, budget)


# --------------------------------------------------------------------------------------------------------------------
# verl glue: the Ray actor, the driver-side replica and the worker-side adapter.
# --------------------------------------------------------------------------------------------------------------------


def server_name(replica_rank: int) -> str:
    """Ray actor name of a replica's server; the trainer-side adapter finds the server by it."""
    return f"{SERVER_NAME_PREFIX}{replica_rank}"


def _model_path(model_config: Any) -> str:
    get = model_config.get if hasattr(model_config, "get") else lambda k, d=None: getattr(model_config, k, d)
    path = get("local_path", None) or get("path", None)
    if not path or not os.path.isdir(path):
        raise OptionsError(f"verl_ext_cpu: model path must be a local folder, got {path!r}")
    return str(path)


class CPUGenerationServer:
    """Ray actor serving one transformers model token-in/token-out (the verl server contract of vLLM/SGLang)."""

    def __init__(
        self,
        model_path: str,
        *,
        prompt_length: int,
        response_length: int,
        max_model_len: int | None = None,
        seed: int = 0,
        force_text: str | None = None,
        force_every_turn: bool = False,
        prefix_cache: bool = False,
        faults: Sequence[Mapping[str, Any]] | None = None,
        truth_log: str | None = None,
    ) -> None:
        """``force_text``: the TEST/DEMO hook (see the module docstring), forced on a trajectory's first turn, or on
        every turn with ``force_every_turn`` (a long-rollout benchmark: every turn a tool call). ``prefix_cache``:
        keep the last request's keys and values for the next request that extends it (``PrefixCache``).
        ``faults``: TEST ONLY (cpu_faults.py), ``engine_kwargs.verl_ext_cpu.faults`` as configured; ``truth_log``:
        TEST ONLY, a JSONL file of the version that generated each request's ids (cpu_pause.py)."""
        from transformers import AutoTokenizer

        self.model = load_model(model_path)
        self.vision = vision_of(model_path, self.model.config)  # None for a text-only model
        self.eos_ids = eos_ids_of(self.model)
        self.prompt_length = prompt_length
        self.response_length = response_length
        self.max_model_len = max_model_len or getattr(self.model.config, "max_position_embeddings", None)
        self.generator = torch.Generator().manual_seed(seed)
        self.lock = asyncio.Lock()
        self.global_steps: int | None = None
        self.weight_syncs = 0
        self.force_ids: list[int] = []
        self.force_every_turn = force_every_turn
        self.cache = PrefixCache() if prefix_cache else None
        self.faults: tuple[Fault, ...] = parse_faults(faults)
        self._reported = tuple(f for f in self.faults if f.kind in ("past_depth", "turn", "bf16"))
        self._stale = frozenset().union(*(f.versions or () for f in self.faults if f.kind == "stale_weights"))
        self._score_shift = sum(f.shift for f in self.faults if f.kind == "score_shift")
        self._calls = CallNumbers() if any(f.kind == "turn" for f in self.faults) else None
        self._received: list[tuple[str, torch.Tensor]] | None = None  # the last sync's weights (stale_weights)
        self.gate = GenerationGate()  # verl's abort / resume (partial rollouts), between two ids
        parking = next((f for f in self.faults if f.kind == "abort_after"), None)
        self._park = ParkPlan(parking.tokens if parking else None, parking.wait_s if parking else 0.0)
        self.truth = TruthLog(truth_log)
        self._in_flight: set[str] = set()
        self.fault_hits: dict[str, int] = {}
        self.tokenizer: Any = None
        if force_text or any(f.rows_containing for f in self.faults):
            self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        if self.faults:
            logger.warning(
                "verl_ext_cpu: TEST ONLY faults set (numbers, weights or stops wrong on purpose): %s", self.faults
            )
        if force_text:
            tokenizer = self.tokenizer
            self.force_ids = tokenizer.encode(force_text, add_special_tokens=False)
            logger.warning(
                "verl_ext_cpu: TEST/DEMO hook %s set: forcing %d tokens as %s",
                FORCE_ENV,
                len(self.force_ids),
                "every turn" if force_every_turn else "every trajectory's first turn",
            )

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        """One engine call: sample from ``prompt_ids`` on CPU with verl's sampling params (text only), returning the
        ids, their logprobs when asked, the finish reason and the weights' step."""
        if video_data is not None or kwargs.get("audio_data") is not None:
            raise NotImplementedError("verl_ext_cpu serves text and images only (no video or audio)")
        prompt_ids = [int(i) for i in prompt_ids]
        vision = self._vision_inputs(prompt_ids, image_data)
        cfg = sampling_config_from_params(
            dict(sampling_params),
            default_max_tokens=default_max_tokens(
                len(prompt_ids), self.prompt_length, self.response_length, self.max_model_len
            ),
            eos_ids=self.eos_ids,
        )
        generator = torch.Generator().manual_seed(cfg.seed) if cfg.seed is not None else self.generator
        forced = list(self.force_ids) if self.force_every_turn else forced_prefix(prompt_ids, self.force_ids)
        self._in_flight.add(request_id)
        try:
            run = await self._run(prompt_ids, cfg, forced, generator, vision)
        finally:
            self._in_flight.discard(request_id)
        if run is None:  # the gate rejects requests (abort with reject_request): aborted, nothing generated
            return TokenOutput(
                token_ids=[],
                log_probs=[] if cfg.logprobs else None,
                stop_reason=ABORTED,
                num_preempted=0,
                extra_fields=self._extra(prompt_ids, None, False),
            )
        result, version = run
        log_probs = self._reported_logprobs(prompt_ids, result) if cfg.logprobs else None
        self.truth.write(prompt_ids, result.token_ids, version, result.finish_reason)
        return TokenOutput(
            token_ids=result.token_ids,
            log_probs=log_probs,
            stop_reason=result.finish_reason,
            num_preempted=0,
            extra_fields=self._extra(prompt_ids, version, result.finish_reason != ABORTED),
        )

    async def _run(
        self, prompt_ids: list[int], cfg: SamplingConfig, forced: list[int], generator: Any, vision: Any
    ) -> tuple[Generation, int | None] | None:
        """Generate once the gate admits the request, on the weights served when it takes the model (the version
        returned); an abort stops it between two ids. None: the gate rejects requests. A request the TEST ONLY
        ``abort_after`` fault parks returns, aborted, when verl's abort comes (cpu_pause.py)."""
        while True:
            if not await self.gate.admit():
                return None
            async with self.lock:
                if self.gate.paused:  # closed while this request waited for the model: park it again
                    continue
                version = self.global_steps  # stamped at dispatch: the weights cannot change while it runs
                park = self._park.park_at(prompt_ids, len(forced), version)
                # a parked request returns on any abort after its dispatch: one whose resume followed it before
                # this request ran again (between the thread's return and here) still wakes it
                aborts = self.gate.aborts

                def should_stop(done: int, park: int | None = park) -> bool:
                    return self.gate.stop_requested() or (park is not None and done >= park)

                # generation blocks; a thread keeps the actor answering abort/update_weights/sleep/... meanwhile
                result = await asyncio.to_thread(
                    generate_tokens,
                    self.model,
                    prompt_ids,
                    cfg,
                    forced_ids=forced,
                    generator=generator,
                    vision=vision,
                    banned_ids=self.vision.banned_ids if self.vision is not None else (),
                    prefix_cache=self.cache,
                    should_stop=should_stop,
                )
            break
        if result.finish_reason == ABORTED:
            if park is not None and not self.gate.stop_requested():  # parked: the model is free, wait for verl
                self.fault_hits["abort_after"] = self.fault_hits.get("abort_after", 0) + 1
                if not await self.gate.wait_for_abort(aborts, self._park.wait_s):
                    self.fault_hits["abort_after_timeout"] = self.fault_hits.get("abort_after_timeout", 0) + 1
            self._park.aborted(prompt_ids, result.token_ids)
        elif park is not None:
            self._park.finished_unparked(version)
        return result, version

    def _extra(self, prompt_ids: Sequence[int], version: int | None, complete: bool) -> dict[str, Any]:
        """verl's ``global_steps`` (the weights served as the output returns) and verl_ext's engine report: the
        version the request was generated on (at dispatch and at its stop: the same on this engine, whose weights
        change only between requests), the CRC of the prompt ids received and whether the output is whole."""
        report = {**engine_stamps(version, version, prompt_ids), "weight_version": self.global_steps}
        report["complete"] = complete
        return {"global_steps": self.global_steps, ENGINE_FIELD: report}

    def _reported_logprobs(self, prompt_ids: list[int], result: Generation) -> list[float]:
        """The logprobs this request reports: the generation's own, or with the TEST ONLY faults that select it
        applied (the ids, counts and everything else of the output are left as sampled)."""
        number = 0
        if self._calls is not None:  # every call is numbered, selected or not, so later calls count right
            number = self._calls.number(prompt_ids)
            self._calls.remember(prompt_ids, result.token_ids, number, aborted=result.finish_reason == ABORTED)
        if not self._reported:
            return result.log_probs
        text: list[str] = []

        def prompt_text() -> str:
            if not text:
                text.append(self.tokenizer.decode(prompt_ids, skip_special_tokens=False))
            return text[0]

        hit = [f for f in self._reported if f.selects(self.global_steps, prompt_text)]
        for fault in hit:
            self.fault_hits[fault.kind] = self.fault_hits.get(fault.kind, 0) + 1
        return perturbed(result.log_probs, len(prompt_ids), number, hit) if hit else result.log_probs

    async def score(self, ids: list[int], start: int, temperature: float = 1.0) -> dict[str, Any]:
        """The scoring path (the re-feed audit's): the logprob of each of ``ids[start:]`` after the ids before it,
        from one prefill forward on the weights now served; ``ids`` the scored ids and ``global_steps`` the version
        that scored them. Temperature as in generation (logits / temperature; 0 scores at 1)."""
        ids = [int(i) for i in ids]
        async with self.lock:
            scores = await asyncio.to_thread(score_tokens, self.model, ids, int(start), float(temperature))
            version = self.global_steps
        if self._score_shift:  # TEST ONLY: a scoring path that lies
            scores = [x + self._score_shift for x in scores]
        return {"logprobs": scores, "ids": ids[int(start) :], "global_steps": version}

    def _vision_inputs(self, prompt_ids: list[int], image_data: Any) -> VisionInputs | None:
        """The request's images as model inputs (None without images); an image for a text-only model, and a prompt
        holding image placeholders sent without images, are refused."""
        if not image_data:
            if self.vision is not None:
                self.vision.refuse_placeholders_without_images(prompt_ids)
            return None
        if self.vision is None:
            raise EngineRequestError("verl_ext_cpu: the request holds images but the served model is text-only")
        return self.vision.inputs(prompt_ids, list(image_data))

    async def update_weights(self, weights: list[tuple[str, torch.Tensor]], global_steps: int | None = None) -> int:
        """Load the trainer's weights into the model (between steps); returns how many tensors were loaded."""
        async with self.lock:
            if self.cache is not None:  # its keys and values are the old weights'
                self.cache.clear()
            weights = list(weights)
            if global_steps is not None and global_steps in self._stale:  # TEST ONLY: the sync is not applied
                previous, self._received = self._received, weights
                loaded = load_weights(self.model, previous) if previous is not None else len(weights)
                self.fault_hits["stale_weights"] = self.fault_hits.get("stale_weights", 0) + 1
                logger.warning("verl_ext_cpu: TEST ONLY stale_weights: sync %s not applied", global_steps)
            else:
                loaded = load_weights(self.model, weights)
                self._received = weights if self._stale else None
            self.weight_syncs += 1
            if global_steps is not None:
                self.global_steps = global_steps
        logger.info(
            "verl_ext_cpu: weight sync %d (global_steps=%s): loaded %d tensors, missing=[]",
            self.weight_syncs,
            global_steps,
            loaded,
        )
        return loaded

    async def set_global_steps(self, global_steps: int) -> None:
        """The trainer step the current weights belong to (reported with each output)."""
        self.global_steps = global_steps

    async def stats(self) -> dict[str, Any]:
        """Weight syncs, the weights' step, the forced-call ids and how often each TEST ONLY fault hit, for tests and
        logs."""
        return {
            "weight_syncs": self.weight_syncs,
            "global_steps": self.global_steps,
            "force_ids": len(self.force_ids),
            "fault_hits": dict(self.fault_hits),
        }

    # Lifecycle calls verl's replica/checkpoint manager forward to every server. Nothing to free on CPU: the model
    # stays resident and no KV cache is kept between requests but the optional prefix cache; an abort stops the
    # request in flight between two ids (cpu_pause.py).
    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Nothing to wake: the model stays resident on CPU."""
        return None

    async def sleep(self) -> None:
        """Nothing to free: the model stays resident on CPU."""
        return None

    async def clear_kv_cache(self) -> None:
        """Drop the prefix cache, if on (no other KV cache is kept between requests)."""
        async with self.lock:
            if self.cache is not None:
                self.cache.clear()

    async def release_kv_cache(self) -> None:
        """Drop the prefix cache, if on (no other KV cache is kept between requests)."""
        await self.clear_kv_cache()

    async def resume_kv_cache(self) -> None:
        """No KV cache is kept between requests."""
        return None

    async def abort_all_requests(self, reject_request: bool = False, **kwargs: Any) -> dict[str, Any]:
        """verl's abort before a weight update: the request being generated stops between two ids and returns
        aborted with what it has; new requests are parked until ``resume_generation`` (answered aborted at once with
        ``reject_request``). Returns the requests in flight that were aborted."""
        aborted = sorted(self._in_flight)
        self.gate.abort(reject_request)
        logger.info("verl_ext_cpu: abort %d (%d requests in flight)", self.gate.aborts, len(aborted))
        return {"aborted_count": len(aborted), "request_ids": aborted}

    async def resume_generation(self) -> None:
        """verl's resume after the weight update: parked requests go on, on the weights served now."""
        self.gate.resume()

    async def start_profile(self, **kwargs: Any) -> None:
        """No engine profiler on CPU."""
        return None

    async def stop_profile(self) -> None:
        """No engine profiler on CPU."""
        return None


class CPURolloutReplica(RolloutReplica):
    """One CPU server per replica; only a world size of 1 (tp = dp = pp = 1) is supported."""

    async def launch_servers(self) -> None:
        """Start the one CPU server actor (on the node of the replica's first worker); refuses parallel sizes above
        1."""
        if self.world_size != 1:
            raise OptionsError(f"verl_ext_cpu: tensor/data/pipeline parallel sizes must be 1 (world {self.world_size})")
        node_id = None
        if self.workers:
            node_id = await self.workers[0].__ray_call__.remote(lambda _: ray.get_runtime_context().get_node_id())
        options: dict[str, Any] = {
            "name": server_name(self.replica_rank) + self.name_suffix,
            "num_cpus": 0,  # the trainer's pools own the (logical) CPUs; generation shares the host
            "max_concurrency": self.max_concurrency,
        }
        if node_id is not None:
            options["scheduling_strategy"] = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                node_id=node_id, soft=False
            )
        force_text = os.environ.get(FORCE_ENV) or None
        own = engine_options(getattr(self.config, "engine_kwargs", None))
        server = (
            ray.remote(CPUGenerationServer)
            .options(**options)
            .remote(
                _model_path(self.model_config),
                prompt_length=self.config.prompt_length,
                response_length=self.config.response_length,
                max_model_len=self.config.max_model_len,
                seed=int(getattr(self.config, "seed", 0) or 0) + self.replica_rank,
                force_text=force_text,
                faults=own.get("faults"),
                truth_log=own.get("truth_log"),
            )
        )
        await server.stats.remote()  # surfaces a model-loading error here rather than at the first request
        self.servers = [server]
        self._server_handle = server
        self._server_address = f"verl_ext_cpu:{self.replica_rank}{self.name_suffix}"


class CPUServerAdapter(BaseRollout):
    """Worker-side half: lives in the trainer process and pushes the trainer's weights to the server each step."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(config, model_config, device_mesh)
        world = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        rank = int(os.environ.get("RANK", "0"))
        # verl's CheckpointEngineWorker (separate rollout pools) passes its replica's rank; RANK is then the rank
        # within that replica's own worker group
        self.replica_rank = int(kwargs.get("replica_rank", rank // world))
        self.is_leader = rank % world == 0
        self._server: Any = None

    def _server_handle(self) -> Any:
        if self._server is None:
            self._server = ray.get_actor(server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        """Nothing to resume: the CPU server never releases its model."""
        return None

    async def release(self) -> None:
        """Nothing to release: the CPU server keeps its model."""
        return None

    async def update_weights(self, weights: Any, wire_format: str = "named_tensors", **kwargs: Any) -> None:
        """Send the trainer's named tensors to the CPU server (the only wire format it takes; LoRA adapters must be
        merged)."""
        if wire_format != "named_tensors":
            raise NotImplementedError(f"verl_ext_cpu: weight wire format {wire_format!r} is not supported")
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError("verl_ext_cpu: LoRA adapter sync is not supported (use lora.merge=true)")
        # every rank drains the generator: producing full tensors from FSDP shards is a collective
        # a checkpoint engine's receive_weights (separate rollout pools) is an async generator
        named = [(name, tensor.detach().to("cpu").clone()) async for name, tensor in ensure_async_iterator(weights)]
        if not self.is_leader:
            return None
        loaded = await self._server_handle().update_weights.remote(named, kwargs.get("global_steps"))
        logger.info("verl_ext_cpu: synced %d/%d tensors to %s", loaded, len(named), server_name(self.replica_rank))
        return None
