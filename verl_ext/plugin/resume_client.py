"""verl_ext's resume client for verl's async trainers: verl's ``FullyAsyncLLMServerClient``, keeping every attempt.

Under the v1 trainer's ``colocate_async`` and ``separate_async`` modes and ``fully_async_policy``, verl hands the
agent loops a ``FullyAsyncLLMServerClient`` (verl/workers/rollout/llm_server.py). When a weight update aborts a request
it re-sends the prompt + the ids so far and joins the outputs, invisibly to the loop; but the joined output's
``extra_fields`` hold only ``global_steps`` (the last attempt's, read on return), ``min/max_global_steps`` and
``num_cached_tokens``: each attempt's ``verl_ext_engine`` report (the version it was sent on, whether it is whole,
ids the id check cut), its own logprobs and the split points between attempts are gone.

``AttemptKeepingClient`` is that client with the resume done by verl_ext's ``generate_turn`` (engine_turn.py, the
mechanism verl_ext's loops continue aborted turns with), so every attempt is kept as a segment:

* ``generate_attempt``: one engine call, never resumed (verl's plain ``LLMServerClient.generate``, the load balancer's
  retry while it has no server kept). ``generate_turn`` calls it, so verl_ext's loops see every abort themselves;
* ``generate``: the whole request, resumed as verl's client resumes it, for a loop that knows nothing of resumes
  (verl's stock ``tool_agent`` under ``verl_ext_audited_tool_agent``): one ``TokenOutput`` of the joined ids and
  logprobs whose ``extra_fields`` carry the first attempt's fields, verl's ``min/max_global_steps`` from the versions
  the first and last attempts were sent on (where the engine stamps them) and the segments under ``SEGMENTS_FIELD``;
  its ``verl_ext_engine`` report is the joined output's (``engine_turn.joined_report``: each attempt's kept in it).
  Under ``async_training.partial_rollout: false`` it resumes nothing, as verl's client does.

How it is plugged in: verl gives each agent loop its server manager (v1: the trainer's ``get_llm_client()``);
verl_ext's loops pass it through ``keep_attempts``, which swaps verl's ``FullyAsyncLLMServerClient`` (that exact
class) for this subclass over the same load balancer, once per client. Nothing to configure; loops that are not
verl_ext's keep verl's client. A subclass of verl's client that verl_ext does not know is kept as it is (warned once):
its resumes lose the attempts as verl's do.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient, LLMServerClient
from verl.workers.rollout.replica import TokenOutput

from verl_ext.core.bounded_cache import LruCache
from verl_ext.core.version_spans import SEG_RETURN_VERSION, SEG_VERSION
from verl_ext.plugin.engine_turn import generate_turn
from verl_ext.plugin.trainer_mode import resumes_aborted_requests

log = logging.getLogger("verl_ext.plugin")

SEGMENTS_FIELD = "verl_ext_segments"  # TokenOutput.extra_fields key: one dict per attempt (core/version_spans.py)
_SWAPPED = "_verl_ext_attempt_keeping_client"  # the swapped client, kept on verl's (one per worker process)
_LIMIT_KEYS = ("max_tokens", "max_new_tokens")
_warned: LruCache[str, bool] = LruCache("resume clients warned about", 64)  # class names (a handful per process)


class AttemptKeepingClient(FullyAsyncLLMServerClient):
    """verl's resume client whose resumes keep each attempt's ids, logprobs, report and split point."""

    async def generate_attempt(
        self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kwargs: Any
    ) -> TokenOutput:
        """One engine call, returned as the server returned it (aborted or not): no resume."""
        return await LLMServerClient.generate(
            self, request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kwargs
        )

    async def generate(
        self,
        request_id: str,
        *,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        image_data: list[Any] | None = None,
        **kwargs: Any,
    ) -> TokenOutput:
        """The request until it is whole (resumed after each abort), with its attempts as segments in
        ``extra_fields[SEGMENTS_FIELD]``. The budget is ``max_tokens`` (or ``max_new_tokens``), else
        ``rollout.response_length``, over all attempts, as verl's client counts it. Under
        ``async_training.partial_rollout: false`` an aborted attempt is returned as it came back, not resumed, as
        verl's client returns it (``plugin.trainer_mode.resumes_aborted_requests``)."""
        budget = next((sampling_params[k] for k in _LIMIT_KEYS if sampling_params.get(k) is not None), None)
        budget = int(budget) if budget is not None else self._configured_response_length()
        if budget is None:
            return await super().generate(
                request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, image_data=image_data, **kwargs
            )
        params = {k: v for k, v in sampling_params.items() if k not in _LIMIT_KEYS}
        bound = _Bound(self, kwargs)
        resume = resumes_aborted_requests(self.config)
        turn = await generate_turn(
            bound, request_id, list(prompt_ids), params, budget, Counter(), image_data, resume_aborts=resume
        )
        extra = dict(turn.extra_fields)
        # verl's staleness fields from the versions the attempts were sent on, where the engine stamps them (verl's
        # own client reads each attempt's version on return); global_steps stays the last attempt's, as verl's
        sent = [s[SEG_VERSION] if s[SEG_VERSION] is not None else s[SEG_RETURN_VERSION] for s in turn.segments]
        extra.update(
            global_steps=turn.segments[-1][SEG_RETURN_VERSION], min_global_steps=sent[0], max_global_steps=sent[-1]
        )
        extra[SEGMENTS_FIELD] = turn.segments
        return TokenOutput(
            token_ids=turn.token_ids,
            log_probs=turn.log_probs,
            stop_reason="length" if len(turn.token_ids) >= budget else turn.stop_reason,
            num_preempted=0,
            extra_fields=extra,
        )


class _Bound:
    """The client's one-attempt path with the request's other keywords (audio, video, ...) bound in."""

    def __init__(self, client: AttemptKeepingClient, kwargs: Mapping[str, Any]) -> None:
        self.client, self.kwargs = client, dict(kwargs)

    async def generate_attempt(self, request_id: str, **kw: Any) -> TokenOutput:
        return await self.client.generate_attempt(request_id, **kw, **self.kwargs)


def keep_attempts(server_manager: Any) -> Any:
    """The server manager a verl_ext loop uses: verl's ``FullyAsyncLLMServerClient`` swapped for
    ``AttemptKeepingClient`` over the same load balancer (made once per client), anything else as it is."""
    if type(server_manager) is not FullyAsyncLLMServerClient:
        kind = type(server_manager)
        unknown = isinstance(server_manager, FullyAsyncLLMServerClient) and not isinstance(
            server_manager, AttemptKeepingClient
        )
        if unknown and _warned.get(kind.__qualname__) is None:
            _warned[kind.__qualname__] = True
            log.warning(
                "verl_ext: the rollout client %s resumes aborted requests itself; verl_ext keeps it, and its "
                "resumes lose each attempt's report and split point (verl_ext's AttemptKeepingClient keeps them)",
                kind.__qualname__,
            )
        return server_manager
    swapped = server_manager.__dict__.get(_SWAPPED)
    if swapped is None:
        swapped = AttemptKeepingClient(
            config=server_manager.config,
            load_balancer_handle=server_manager._load_balancer,
            only_hybrid=getattr(server_manager, "_only_hybrid", False),
        )
        server_manager.__dict__[_SWAPPED] = swapped
    return swapped
