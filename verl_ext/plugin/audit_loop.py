"""``verl_ext_audited_tool_agent``: verl's stock ``tool_agent``, unchanged, with verl_ext's check watching it.

Run it before switching loops: it records every engine call of the stock loop, runs the consistency check on each
rollout in audit-only mode (never raises; ``check.mode=off`` still turns it off) and reports the same ``tito/``
metrics, extra fields and records as ``verl_ext_tool_agent``. The tokens the trainer gets are the stock loop's; its
loss mask is the stock loop's with ``verl_ext.max_token_lag`` applied, as every verl_ext loop applies it.
Under verl's async trainers its server manager is verl_ext's resume client (resume_client.py): a turn resumed after
a weight update reaches the stock loop whole, as verl's client hands it over, and its attempts are recorded.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop

from verl_ext.check.inputs import TrainerSample
from verl_ext.check.policy import CheckMode
from verl_ext.core.version_spans import Attempt, RolloutVersions, resumed_fields, segment
from verl_ext.engines.sglang_output import ENGINE_FIELD
from verl_ext.plugin.agent_loop import plain_index, runtime_for, training_step
from verl_ext.plugin.loop_names import AUDIT_LOOP_NAME
from verl_ext.plugin.options import LoopOptions
from verl_ext.plugin.resume_client import SEGMENTS_FIELD, keep_attempts
from verl_ext.plugin.trainer_mode import TrainerMode
from verl_ext.runtime import LiveRollout


class _RecordingServer:
    """Forwards to verl's server manager and records each call as it returns, into the watched rollout
    (``LiveRollout.record``; None: the check is off, nothing is recorded). Its log keeps only what each prompt adds to
    the previous call's prompt + output (``EngineCalls``), so a long rollout's record is O(stream), not O(turns x
    stream); the call is recorded before the stock loop gets the output, and so before it extends its prompt list in
    place."""

    def __init__(self, inner: Any, rollout: LiveRollout | None) -> None:
        self.inner = inner
        self.rollout = rollout
        self.made = 0  # generate calls answered
        self.last_output: Any = None
        self.resumed: list[dict[str, Any]] = []  # calls verl_ext's resume client resumed: their segments
        self.attempts: list[tuple[Attempt, ...]] = []  # each recorded call's attempts (the record's versions)

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any):
        output = await self.inner.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kw)
        segments = (output.extra_fields or {}).pop(SEGMENTS_FIELD, None)  # recorded here, not handed to verl
        if not segments:  # one attempt (a client that does not resume, or verl's, which keeps no segments)
            report = (output.extra_fields or {}).get(ENGINE_FIELD) or {}
            segments = [
                segment(
                    0, output.token_ids, output.stop_reason, True, report, output.extra_fields or {}, output.log_probs
                )
            ]
        self.attempts.append(tuple(Attempt.of(s) for s in segments))
        if len(segments) > 1:
            self.resumed.append({"turn": self.made, "segments": [resumed_fields(s) for s in segments]})
        if self.rollout is not None:
            max_tokens = int(sampling_params.get("max_tokens") or 1 << 30)
            stops = sampling_params.get("stop_token_ids") or ()
            label = (output.extra_fields or {}).get("global_steps")  # the weight label it was served on
            self.rollout.record(prompt_ids, output.token_ids, output.log_probs, max_tokens, stops, label=label)
        self.made += 1
        self.last_output = output
        return output

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class AuditedToolAgentLoop(ToolAgentLoop):
    """verl's stock ``tool_agent`` with the end-of-rollout check watching (``warn`` or ``off``, never ``strict``): the
    loop is verl's, the engine calls are recorded and checked."""

    def __init__(self, *args: Any, verl_ext: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_manager = keep_attempts(self.server_manager)  # verl's resume client: each attempt kept
        options = LoopOptions.from_sources(self.config.get("verl_ext"), verl_ext)
        audit = CheckMode.OFF if options.check.mode is CheckMode.OFF else CheckMode.WARN
        self.options = dataclasses.replace(options, check=dataclasses.replace(options.check, mode=audit))
        self.rt = runtime_for(
            self.tokenizer, self.apply_chat_template_kwargs, self.options, self.tool_parser.stop_token_ids
        )
        self._agent_data: AgentData | None = None
        self.trainer_mode = TrainerMode.of(self.config)  # what the engine's weight label means (plugin.trainer_mode)

    async def _handle_pending_state(self, agent_data: AgentData, sampling_params: dict[str, Any]) -> AgentState:
        self._agent_data = agent_data  # the stock loop keeps its messages here; the check needs the final ones
        return await super()._handle_pending_state(agent_data, sampling_params)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """Run verl's loop with its server manager recorded, then check the rollout it produced (the verdict goes into
        the output's ``extra_fields``)."""
        checked = self.options.check.mode is not CheckMode.OFF
        # the rollout starts as the stock loop renders its prompt: its template clock is pinned now. With the check
        # off it is still watched where max_token_lag is set: the mask reads the recorded calls' versions
        watched = checked or self.options.max_token_lag is not None
        live = self.rt.rollout(watched=True) if watched else None
        recorder = _RecordingServer(self.server_manager, live)
        self.server_manager = recorder
        try:
            output = await super().run(sampling_params, **kwargs)
        finally:
            self.server_manager = recorder.inner
        if live is None:
            return output
        sample = TrainerSample.of(
            output.prompt_ids, output.response_ids, output.response_mask, output.response_logprobs
        )
        data = self._agent_data
        messages = list(data.messages) if data is not None else list(kwargs["raw_prompt"])
        prompt_messages = len(kwargs["raw_prompt"])
        await self._complete_messages(messages, prompt_messages, recorder, data)
        tools = (getattr(data, "_active_tool_schemas", None) if data is not None else None) or self.tool_schemas or None
        live.watch(kwargs["raw_prompt"], tools)
        # the stock loop keeps the first engine call's extra fields, as verl_ext_tool_agent does
        step = training_step(kwargs, output.extra_fields.get("global_steps"))
        finished = live.finish(
            response_length=self.response_length,
            step=step,
            versions=RolloutVersions(tuple(recorder.attempts), trained_step=step),
            trainer=self.trainer_mode,  # the record's trainer entry and the versions' sync convention
            extra={
                "loop": AUDIT_LOOP_NAME,
                "data_source": kwargs.get("data_source"),
                "index": plain_index(kwargs.get("index")),
                **({"resumed_turns": recorder.resumed} if recorder.resumed else {}),
            },
            sample=sample,
            messages=messages,
        )
        # max_token_lag's mask over the stock loop's, and the tito/async counters, as for every loop (verl_ext.runtime)
        output.response_mask = live.trainer_mask(finished)
        result = live.conclude(finished)
        output.extra_fields.update(finished.rollout.batch_fields(result))
        return output

    async def _complete_messages(
        self, messages: list[dict[str, Any]], prompt_messages: int, recorder: _RecordingServer, data: AgentData | None
    ) -> None:
        """The stock loop returns before appending the last assistant message when it stops on the turn or length
        limit; its tokens are fine, so add the message it would have parsed rather than report its absence."""
        made = sum(1 for m in messages[prompt_messages:] if m.get("role") == "assistant")
        if made >= recorder.made or data is None:
            return
        output = recorder.last_output
        content, calls = await self.tool_parser.extract_tool_calls(output.token_ids, [])
        data.tool_calls = calls
        messages.append(self._build_assistant_message(content, data))
