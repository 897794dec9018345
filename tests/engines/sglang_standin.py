"""SGLang's side of ``SGLangHttpServer.generate`` on CPU, for tests: what the server's ``tokenizer_manager`` returns.

Two sources, one output format (``{"output_ids": [...], "meta_info": {...}}``, as SGLang 0.5.12 returns it under
``skip_tokenizer_init``):

* ``ScriptedTokenizerManager``: SGLang's own code everywhere except the model, which needs a GPU. The request is
  SGLang's ``GenerateReqInput`` (normalised by SGLang) turned into the scheduler's request by SGLang's own
  ``TokenizerManager._tokenize_one_request`` (its ``SamplingParams`` normalised and verified; with images, the
  model's multimodal processor, SGLang's ``QwenVLImageProcessor`` over the tiny VL processor, rebuilds the prompt
  ids and they replace the request's, as on a GPU: ``scheduled`` keeps the ids SGLang would run the model on), the
  finish decided by SGLang's ``Req.check_finished`` as the scripted ids arrive one by one (an abort is
  ``FINISH_ABORT``, as ``abort_request`` sets it), and the output dict assembled by SGLang's
  ``TokenizerManager._handle_batch_output`` from a ``BatchTokenIDOutput``, as the scheduler sends it. Only the ids
  and their logprobs are scripted; or, per step, the ids the model prefers (``Script.prefer``), picked greedily
  after SGLang's own ``SamplingBatchInfo`` applies the request's logit bias.
* ``RecordedTokenizerManager``: replays recordings from a GPU run (tests/fixtures/sglang/*.json:
  ``{"case", "request": {GenerateReqInput fields}, "response": {"output_ids", "meta_info"}}``); it checks that the
  server sends the recorded request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

RECORDINGS = Path(__file__).resolve().parents[1] / "fixtures" / "sglang"


@dataclass
class Script:
    """What the engine samples for one request: ids (with their logprobs) fed to SGLang's finish check in order.

    ``abort_after``: the request is aborted (``pause_generation(mode="abort")``) after that many ids.
    ``drop_logprob_entries`` / ``wrong_logprob_id_at``: corrupt the logprob payload the scheduler sends (an engine
    bug the server must catch). ``cached_tokens``: the radix-cache hit SGLang reports. ``prefer``: instead of ``ids``,
    per step the ids the model ranks highest, best first; the step samples greedily after SGLang's logit bias."""

    ids: Sequence[int] = ()
    logprobs: Sequence[float] | None = None
    abort_after: int | None = None
    drop_logprob_entries: int = 0
    wrong_logprob_id_at: int | None = None
    cached_tokens: int = 0
    prefer: Sequence[Sequence[int]] | None = None


def input_logprob_at(position: int) -> float:
    """The scripted logprob of the prompt token at ``position`` (a scoring request's input logprobs)."""
    return -1.0 - 0.001 * position


def input_logprobs(obj: Any, req: Any, vocab_size: int) -> tuple[list[Any], list[int]]:
    """SGLang's input-token logprobs (values, ids) for a request with ``logprob_start_len >= 0``: the logits
    processor's values (one per position from the start, predicting the next token; the last one predicts the first
    sampled token) go through SGLang's own ``_process_input_token_logprobs``, which shifts them and adds the
    ``None`` of the first entry. Empty for other requests."""
    from sglang.srt.managers.scheduler_output_processor_mixin import SchedulerOutputProcessorMixin

    start = obj.logprob_start_len
    if not obj.return_logprob or start is None or start < 0:
        return [], []
    req.logprob_start_len = start
    raw = [input_logprob_at(p + 1) for p in range(start, len(obj.input_ids))]
    scheduler = SimpleNamespace(model_config=SimpleNamespace(vocab_size=vocab_size), _is_multi_item_scoring=bool)
    scheduler._is_multi_item_scoring = lambda _req: False
    SchedulerOutputProcessorMixin._process_input_token_logprobs(scheduler, req, raw)
    return list(req.input_token_logprobs_val), list(req.input_token_logprobs_idx)


@contextlib.contextmanager
def global_server_args() -> Iterator[None]:
    """SGLang's sampling and image code read its process-global server args (set by a launched server); the few
    fields they read, for the length of one request, unless a real value is set."""
    import sglang.srt.server_args as server_args

    if server_args._global_server_args is not None:
        yield
        return
    server_args._global_server_args = SimpleNamespace(
        rl_on_policy_target=None, enable_deterministic_inference=False, enable_custom_logit_processor=False
    )
    try:
        yield
    finally:
        server_args._global_server_args = None


def sglang_mm_processor(processor: Any, hf_config: Any, *, skip_tokenizer_init: bool = True) -> Any:
    """SGLang's own multimodal processor for a Qwen2/2.5/3-VL model (``QwenVLImageProcessor``) over an HF
    processor, as SGLang's tokenizer manager builds it (``get_mm_processor``), with its default image settings."""
    from sglang.srt.multimodal.processors.qwen_vl import QwenVLImageProcessor

    server_args = SimpleNamespace(
        mm_process_config={},
        skip_tokenizer_init=skip_tokenizer_init,
        disable_fast_image_processor=False,
        keep_mm_feature_on_device=False,
        tokenizer_worker_num=1,
    )
    return QwenVLImageProcessor(hf_config, server_args, processor, None)


class _Batch:
    """The part of SGLang's ``ScheduleBatch`` its ``SamplingBatchInfo`` reads (a weak reference is taken)."""

    def __init__(self, reqs: list[Any]) -> None:
        self.reqs, self.device = reqs, "cpu"


def preferred_pick(req: Any, ranked: Sequence[int], vocab_size: int) -> int:
    """The greedy pick of one step whose logits rank ``ranked`` highest (best first), after SGLang's own
    ``SamplingBatchInfo`` applies the request's logit bias and penalties to them."""
    import torch
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    logits = torch.zeros(1, vocab_size)
    for rank, token in enumerate(ranked):
        logits[0, int(token)] = 10.0 - rank
    batch = _Batch([req])
    info = SamplingBatchInfo.from_schedule_batch(batch, vocab_size)
    info.update_penalties()
    info.apply_logits_bias(logits)
    return int(torch.argmax(logits, dim=-1)[0])


@dataclass
class ScriptedTokenizerManager:
    eos_token_ids: set[int]
    vocab_size: int
    scripts: list[Script] = field(default_factory=list)
    weight_version: str = "default"
    requests: list[Any] = field(default_factory=list)  # the GenerateReqInput objects received
    mm_processor: Any = None  # SGLang's multimodal processor (sglang_mm_processor) for a VL model, else None
    context_len: int = 32768
    scheduled: list[list[int]] = field(default_factory=list)  # the prompt ids SGLang runs the model on, per request

    def __post_init__(self) -> None:
        from sglang.srt.managers.tokenizer_manager import TokenizerManager
        from sglang.srt.sampling.sampling_params import SamplingParams

        # SGLang's real TokenizerManager methods over only the state _tokenize_one_request and _handle_batch_output
        # read (no ZMQ, no model).
        tm = TokenizerManager.__new__(TokenizerManager)
        tm.server_args = SimpleNamespace(
            batch_notify_size=16,
            weight_version=self.weight_version,
            skip_tokenizer_init=True,
            incremental_streaming_output=False,
            speculative_algorithm=None,
            enable_lora=False,
            dp_size=1,
            language_only=False,
            encoder_transfer_backend=None,
            limit_mm_data_per_request=None,
            allow_auto_truncate=False,
            enable_return_hidden_states=False,
            enable_custom_logit_processor=False,
            disaggregation_transfer_backend=None,
        )
        tm.rid_to_state = {}
        tm.enable_metrics = False
        tm.dump_requests_folder = None
        tm.crash_dump_folder = None
        tm.tokenizer = None  # skip_tokenizer_init
        tm.mm_processor = self.mm_processor
        arch = ["Qwen2_5_VLForConditionalGeneration" if self.mm_processor is not None else "Qwen3ForCausalLM"]
        tm.model_config = SimpleNamespace(hf_config=SimpleNamespace(architectures=arch), vocab_size=self.vocab_size)
        tm.context_len = self.context_len
        tm.max_req_input_len = self.context_len - 1
        tm.num_reserved_tokens = 0
        tm.validate_total_tokens = True
        tm.is_generation = True
        tm.preferred_sampling_params = None
        tm.sampling_params_class = SamplingParams
        self.tm = tm

    @property
    def server_args(self) -> Any:
        return self.tm.server_args

    @property
    def max_req_input_len(self) -> int:
        return int(self.tm.max_req_input_len)

    def generate_request(self, obj: Any, request: Any = None) -> AsyncIterator[dict[str, Any]]:
        return self._generate(obj)

    async def _generate(self, obj: Any) -> AsyncIterator[dict[str, Any]]:
        from sglang.srt.managers.io_struct import BatchTokenIDOutput
        from sglang.srt.managers.schedule_batch import FINISH_ABORT, Req
        from sglang.srt.managers.tokenizer_manager import ReqState

        self.requests.append(obj)
        obj.normalize_batch_and_arguments()
        state = ReqState([], False, asyncio.Event(), obj, time_stats=_time_stats())
        self.tm.rid_to_state[obj.rid] = state  # SGLang registers the request before tokenizing it
        with global_server_args():
            tokenized = await self.tm._tokenize_one_request(obj)  # SGLang's own: with images, its ids replace ours
        sampling = tokenized.sampling_params
        self.scheduled.append(list(tokenized.input_ids))
        req = Req(
            obj.rid,
            "",
            list(tokenized.input_ids),
            sampling,
            return_logprob=obj.return_logprob,
            eos_token_ids=set(self.eos_token_ids),
            vocab_size=self.vocab_size,
        )
        script = self.scripts.pop(0)
        steps = len(script.prefer) if script.prefer is not None else len(script.ids)
        default = [-0.5 - 0.01 * i for i in range(steps)]
        lps = list(script.logprobs) if script.logprobs is not None else default
        for i in range(steps):
            if script.abort_after is not None and i == script.abort_after:
                req.to_finish = FINISH_ABORT()
                req.check_finished()
                break
            if script.prefer is not None:
                with global_server_args():
                    token = preferred_pick(req, script.prefer[i], self.vocab_size)
            else:
                token = int(script.ids[i])
            req.output_ids.append(token)
            req.check_finished()
            if req.finished():
                break
        if not req.finished():
            raise AssertionError(f"script ran out before SGLang finished the request: {script}")
        out = list(req.output_ids_through_stop)
        in_vals, in_idx = input_logprobs(obj, req, self.vocab_size)
        vals, idx = lps[: len(out)], list(out)
        if script.drop_logprob_entries:
            vals, idx = vals[: -script.drop_logprob_entries], idx[: -script.drop_logprob_entries]
        if script.wrong_logprob_id_at is not None:
            idx[script.wrong_logprob_id_at] += 1
        n = 1
        recv = BatchTokenIDOutput(
            rids=[obj.rid],
            spec_verify_ct=[0],
            spec_num_correct_drafts=[0],
            spec_correct_drafts_histogram=[[]],
            finished_reasons=[req.finished_reason.to_json()],
            decoded_texts=[""],
            decode_ids=[out],
            read_offsets=[0],
            output_ids=[out],
            skip_special_tokens=[sampling.skip_special_tokens],
            spaces_between_special_tokens=[sampling.spaces_between_special_tokens],
            no_stop_trim=[sampling.no_stop_trim],
            prompt_tokens=[len(tokenized.input_ids)],
            reasoning_tokens=[0],
            completion_tokens=[len(out)],
            cached_tokens=[script.cached_tokens],
            input_token_logprobs_val=[in_vals],
            input_token_logprobs_idx=[in_idx],
            output_token_logprobs_val=[vals],
            output_token_logprobs_idx=[idx],
            input_top_logprobs_val=[],
            input_top_logprobs_idx=[],
            output_top_logprobs_val=[[]] * n,
            output_top_logprobs_idx=[[]] * n,
            input_token_ids_logprobs_val=[],
            input_token_ids_logprobs_idx=[],
            output_token_ids_logprobs_val=[[]] * n,
            output_token_ids_logprobs_idx=[[]] * n,
            output_token_entropy_val=[None],
            output_hidden_states=None,
            routed_experts=None,
            indexer_topk=None,
            placeholder_tokens_idx=[None],
            placeholder_tokens_val=[None],
            retraction_counts=[0],
        )
        await self.tm._handle_batch_output(recv)
        yield state.out_list[-1]


def _time_stats() -> Any:
    from sglang.srt.managers.tokenizer_manager import APIServerReqTimeStats

    return APIServerReqTimeStats()


@dataclass
class RecordedTokenizerManager:
    """Replays one recorded SGLang response per request, after checking the request is the recorded one."""

    recordings: list[dict[str, Any]]

    def generate_request(self, obj: Any, request: Any = None) -> AsyncIterator[dict[str, Any]]:
        return self._replay(obj)

    async def _replay(self, obj: Any) -> AsyncIterator[dict[str, Any]]:
        rec = self.recordings.pop(0)
        sent = rec["request"]
        assert list(obj.input_ids) == list(sent["input_ids"]), "the server sent other prompt ids than recorded"
        for key, value in (sent.get("sampling_params") or {}).items():
            assert (obj.sampling_params or {}).get(key) == value, f"sampling_params[{key!r}] differs from recording"
        yield rec["response"]


def load_recordings() -> list[dict[str, Any]]:
    """Every recorded case in tests/fixtures/sglang that asked for logprobs, as verl_ext's server always does (the
    other recordings, and model_config.json, document SGLang's behaviour but are not requests our server sends)."""
    recorded = [json.loads(p.read_text()) for p in sorted(RECORDINGS.glob("*.json"))]
    return [r for r in recorded if "case" in r and r.get("request", {}).get("return_logprob")]
