"""verl's ``AgentLoopOutput`` of a finished rollout, built in one place for ``verl_ext_tool_agent`` and
``verl_ext_gateway_agent`` (verl's stock loop under audit builds its own; the audit adds the same batch fields).

``loop_output``: a checked rollout's trainer sample (its mask, or the one a trainer trains of it), its turns as verl
counts them, its images, and the extra fields verl keeps as batch columns: the engine's, the rollout's own
(``Rollout.batch_fields``: the check's verdict and the rollout id, the one place those come from) and the loop's.
``untrained_output``: a row that has no sample to train (its harness failed): the prompt and one masked end token.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

from verl_ext.check.findings import CheckResult
from verl_ext.runtime import FinishedRollout, LiveRollout


def loop_output(
    finished: FinishedRollout,
    result: CheckResult,
    *,
    engine_fields: Mapping[str, Any],
    loop_fields: Mapping[str, Any],
    mask: Sequence[int] | None = None,
    metrics: Mapping[str, Any] | None = None,
) -> AgentLoopOutput:
    """What verl trains on of ``finished``: its sample (with ``mask`` where a trainer trains less than every sampled
    token of it), ``num_turns``, ``multi_modal_data`` and the extra fields (``engine_fields``, then the rollout's
    batch fields, then ``loop_fields``); ``metrics``: verl's timings, where the loop took them."""
    sample = finished.sample
    return AgentLoopOutput(
        prompt_ids=list(sample.prompt_ids),
        response_ids=list(sample.response_ids),
        response_mask=list(sample.response_mask if mask is None else mask),
        response_logprobs=list(sample.response_logprobs) if sample.response_logprobs is not None else None,
        num_turns=finished.num_turns,
        metrics=AgentLoopMetrics(**{k: v for k, v in (metrics or {}).items() if k in AgentLoopMetrics.model_fields}),
        multi_modal_data=finished.multi_modal_data,
        extra_fields={**engine_fields, **finished.rollout.batch_fields(result), **loop_fields},
    )


def untrained_output(
    rollout: LiveRollout, messages: Sequence[Mapping[str, Any]], extra_fields: Mapping[str, Any]
) -> AgentLoopOutput:
    """A row with nothing to train: ``messages`` rendered as its prompt by ``rollout`` (a new one, of the loop's
    image side: a prompt's images expanded as the processor expands them and handed on with it, since verl's worker
    pairs each placeholder run with an image) and one end-of-turn token, all masked out."""
    prompt = rollout.start(messages, None)
    images = rollout.images or []
    end = rollout.runtime.profile.stop_ids[0].id
    return AgentLoopOutput(
        prompt_ids=list(prompt),
        response_ids=[end],
        response_mask=[0],
        response_logprobs=[0.0],
        num_turns=1,
        metrics=AgentLoopMetrics(),
        multi_modal_data={"images": list(images)} if images else None,
        extra_fields=dict(extra_fields),
    )
