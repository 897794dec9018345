"""``verl_ext_tool_agent``: verl's multi-turn tool-calling loop with the token core as its only way to build tokens.

Differences from verl's ``tool_agent`` (whose tools, parser and config it reuses):
- the engine's output ids are appended as sampled, stop token included; the template's boundary tokens the engine
  never generates are repairs (mask 0), derived from the chat template, for any model;
- every engine call is recorded, and the consistency check runs at the end of every rollout: verdict in
  ``extra_fields["verl_ext_check"]``, ``tito/`` metrics per step, optional JSONL records;
- each turn asks for at most what is left of the response budget (``max_tokens``), so nothing sampled is cut;
- malformed calls, unknown tools, tool errors and timeouts become tool messages and counted metrics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.tool_agent_loop import AgentData, ToolAgentLoop
from verl.utils.profiler import simple_timer

from verl_ext.core.bounded_cache import LruCache
from verl_ext.core.errors import OptionsError, TemplateError
from verl_ext.core.prompt_ids import PromptIds
from verl_ext.core.refeed import RefeedResult
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.trajectory import FinishReason
from verl_ext.core.turn_end import stop_text_id
from verl_ext.core.turn_parse import ParsedTurn
from verl_ext.core.version_spans import Attempt, RolloutVersions, resumed_fields
from verl_ext.engines.sglang_images import ImagePromptRebuildError
from verl_ext.plugin import metrics_sink
from verl_ext.plugin.engine_turn import RolloutInterrupted, generate_turn
from verl_ext.plugin.image_loop import prompt_images_decoded, refuse_images_without_vision, vision_for
from verl_ext.plugin.loop_names import AGENT_LOOP_NAME
from verl_ext.plugin.loop_output import loop_output
from verl_ext.plugin.options import LoopOptions
from verl_ext.plugin.refeed_loop import audit_rollout, write_refeed_line
from verl_ext.plugin.resume_client import keep_attempts
from verl_ext.plugin.tool_calls import (
    ParsedCall,
    ToolOutcome,
    ToolStatus,
    call_id,
    over_limit_message,
    parse_turn,
    run_tool,
)
from verl_ext.plugin.trainer_mode import TrainerMode, partial_rollout_refusal
from verl_ext.runtime import LiveRollout, RolloutRuntime
from verl_ext.runtime.rollout import FinishedRollout

log = logging.getLogger("verl_ext.plugin")

AGENT_NAME = "verl_ext_tool_agent"


# (id(tokenizer), template kwargs, options) -> the runtime of that tokenizer and options. A worker process holds one
# tokenizer and one set of options in practice; 16 leaves room for tests and validation loops, never grows with steps.
_RUNTIMES: LruCache[tuple[int, str, str], tuple[Any, RolloutRuntime]] = LruCache("agent loop runtimes", 16)


def runtime_for(
    tokenizer: Any, template_kwargs: Mapping[str, Any], options: LoopOptions, stop_ids: Sequence[int]
) -> RolloutRuntime:
    """The rollout runtime (renderer, template profile, check, policy and record writer) for one tokenizer, template
    kwargs and options, built once per process and shared by every loop instance. Raises ``TemplateError`` when the
    template's verdict is unsupported, ``OptionsError`` for an extra stop token that is not one token."""
    key = (id(tokenizer), json.dumps(dict(template_kwargs), sort_keys=True, default=str), repr(options))
    cached = _RUNTIMES.get(key)
    if cached is not None and cached[0] is tokenizer:  # the tokenizer itself: an id is reused once one is freed
        return cached[1]
    renderer = ChatRenderer(
        tokenizer, template_kwargs=template_kwargs, escape_special_tokens=options.escape_special_tokens
    )
    encode = functools.partial(tokenizer.encode, add_special_tokens=False)
    extra = list(stop_ids) + [stop_text_id(encode, s, "verl_ext.extra_stop_tokens") for s in options.extra_stop_tokens]
    rt = RolloutRuntime.build(
        renderer,
        extra_stop_ids=extra,
        policy=options.check,
        records_dir=options.records.dir,
        records_prefix="rollouts",
        max_bytes=options.records.max_bytes,
        max_files=options.records.max_files,
        thumbnails=options.records.thumbnails,
        sink=metrics_sink.report,
        who=AGENT_NAME,
        max_token_lag=options.max_token_lag,  # applied by LiveRollout.trainer_mask, for every loop
    )
    _RUNTIMES[key] = (tokenizer, rt)
    log.info(
        "verl_ext check ready: template %s (%s), check mode %s, records %s",
        rt.profile.fingerprint,
        rt.profile.verdict.value,
        options.check.mode.value,
        options.records.dir or "off",
    )
    return rt


class VerlExtToolAgentLoop(ToolAgentLoop):
    """verl's tool agent loop with token-exact trajectories: registered as ``verl_ext_tool_agent``. Options come
    from verl's config (``verl_ext:``) and the loop's own config entry (``verl_ext`` keyword); see ``LoopOptions``."""

    loop_name: ClassVar[str] = AGENT_LOOP_NAME  # the name it is registered under (its errors name it)

    def __init__(self, *args: Any, verl_ext: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        refusal = partial_rollout_refusal(self.config, self.loop_name)  # it never trains a turn cut at an abort
        if refusal is not None:
            raise OptionsError(refusal)
        self.server_manager = keep_attempts(self.server_manager)  # verl's resume client: each attempt kept
        self.options = LoopOptions.from_sources(self.config.get("verl_ext"), verl_ext)
        self.rt = runtime_for(
            self.tokenizer, self.apply_chat_template_kwargs, self.options, self.tool_parser.stop_token_ids
        )
        self.trainer_mode = TrainerMode.of(self.config)  # what the engine's weight label means (plugin.trainer_mode)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """One rollout: render the prompt once, then turn by turn generate, parse, run the tools and append their
        replies as tokens; check and record the result; hand verl the trainer sample. Raises ``OptionsError`` for
        a prompt over ``rollout.prompt_length``, ``ConsistencyError`` in strict mode for a defect."""
        messages = [dict(m) for m in kwargs["raw_prompt"]]
        ro = self._start(messages, sampling_params, kwargs)
        try:
            while await self._turn(ro):
                pass
        except RolloutInterrupted:
            metrics_sink.count(ro.live.counters)  # the rollout is dropped, but what happened to it is counted
            raise
        # step 4: finish the rollout; check it, write its record, report its metrics, apply the policy
        step = training_step(kwargs, ro.extra_fields.get("global_steps"))
        finished = ro.live.finish(
            response_length=self.response_length,
            step=step,
            versions=RolloutVersions(tuple(ro.attempts), trained_step=step),
            trainer=self.trainer_mode,  # the record's trainer entry and the versions' sync convention
            extra={
                "loop": AGENT_LOOP_NAME,
                "data_source": kwargs.get("data_source"),
                "index": plain_index(kwargs.get("index")),
                **({"resumed_turns": ro.resumed} if ro.resumed else {}),
            },
        )
        refeed = await self._refeed(ro, finished)
        mask = ro.live.trainer_mask(finished)  # max_token_lag's mask and the tito/async counters (verl_ext.runtime)
        result = ro.live.conclude(finished)
        if refeed is not None and refeed.numerics is not None:
            write_refeed_line(self.rt, refeed, self.options.numerics)
        # step 5: what verl trains on, with the verdict and verl's own extra fields
        return loop_output(
            finished,
            result,
            engine_fields=ro.extra_fields,
            loop_fields={"turn_scores": [], "tool_rewards": ro.rewards},
            mask=mask,
            metrics=ro.metrics,
        )

    # -- the rollout's steps, in order ------------------------------------------------------------
    def _start(
        self, messages: list[dict[str, Any]], sampling_params: dict[str, Any], kwargs: Mapping[str, Any]
    ) -> _RolloutState:
        """Step 1: render the first prompt (never truncated: the engine must see what the trainer trains on)."""
        active, schemas = self._active_tools(kwargs)
        tools = schemas or None
        vision = vision_for(self.processor, self.rt.renderer)
        if vision is None:
            refuse_images_without_vision(messages, "the prompt")
        else:
            messages = prompt_images_decoded(messages)
        live = self.rt.rollout(vision)
        prompt_ids = live.start(messages, tools)
        if len(prompt_ids) > self.prompt_length:
            raise OptionsError(
                f"{AGENT_NAME}: the prompt renders to {len(prompt_ids)} tokens, more than rollout.prompt_length="
                f"{self.prompt_length}; raise data.max_prompt_length (and rollout.prompt_length) or set "
                "data.filter_overlong_prompts=true. The prompt is not truncated, because the engine would see "
                "other tokens than the trainer."
            )
        request_id = uuid4().hex
        metrics: dict[str, Any] = {}
        agent_data = AgentData(messages, None, None, None, None, metrics, request_id, kwargs.get("tools_kwargs", {}))
        stop_ids = sorted(set(sampling_params.get("stop_token_ids") or []) | set(self.tool_parser.stop_token_ids))
        params = dict(sampling_params)
        if stop_ids:
            params["stop_token_ids"] = stop_ids
        return _RolloutState(live, active, prompt_ids, request_id, params, stop_ids, agent_data, metrics)

    async def _turn(self, ro: _RolloutState) -> bool:
        """Step 2, once per assistant turn: generate, keep the output as sampled tokens, parse it, and answer its
        tool calls. False when the rollout ends (no room left, invalid output, no call, length cap, turn limit)."""
        remaining = ro.live.budget(self.response_length)
        if remaining <= 0:
            return False

        async def generate(max_tokens: int) -> Any:
            with simple_timer("generate_sequences", ro.metrics):
                return await generate_turn(
                    self.server_manager,
                    ro.request_id,
                    ro.prompt_ids,
                    dict(ro.params),
                    max_tokens,
                    ro.live.counters,
                    image_data=None if ro.live.images is None else list(ro.live.images),
                )

        async def read(ids: Sequence[int]) -> ParsedTurn:
            return await self._parse(list(ids), ro.turn, ro.live.counters, ro.active)

        try:
            turn = await ro.live.turn(remaining, ro.stop_ids, generate, read)
        except ImagePromptRebuildError as exc:
            # SGLang would have run this turn on other ids than the trajectory's (engine_turn counted it); nothing
            # was sent. The rollout ends before the turn, as when its budget runs out: its earlier turns are exact.
            log.warning("verl_ext: the rollout ends before turn %d: %s", ro.turn, exc)
            return False
        # the record's versions: every turn's attempts as rows (the segments' logprobs are the call's, not kept twice)
        ro.attempts.append(tuple(Attempt.of(s) for s in turn.output.segments))
        if len(turn.output.segments) > 1:
            ro.resumed.append({"turn": ro.turn, "segments": [resumed_fields(s) for s in turn.output.segments]})
        merge_engine_extra_fields(ro.extra_fields, turn.output.extra_fields or {})
        ro.live.keep(turn.call, turn.message, label=(turn.output.extra_fields or {}).get("global_steps"))
        if not turn.valid:
            # Ids the tokenizer cannot decode, NaN/inf logprobs, a stop substituted after a NaN: the trajectory
            # keeps the turn up to the first problem (nothing after it trains), the check names the failure,
            # and no parser or next turn sees the rest.
            ro.live.counters["rollouts_ended_on_invalid_output"] += 1
            return False
        assert turn.parsed is not None  # a valid turn is read
        ro.turn += 1
        parsed, dropped, malformed = turn.parsed.calls, turn.parsed.dropped, turn.parsed.malformed
        if not (parsed or malformed) or turn.finish is FinishReason.LENGTH or self._turn_limit(ro.turn):
            return False
        return await self._reply(ro, parsed, dropped, malformed)

    async def _reply(
        self, ro: _RolloutState, parsed: Sequence[ParsedCall], dropped: Sequence[ParsedCall], malformed: int
    ) -> bool:
        """Step 3: run the parsed calls and append their results (and an error per malformed call) as context
        tokens. False when the template cannot render the reply: the rollout ends there, the check reports it."""
        counters = ro.live.counters
        tool_messages = await self._run_tools(parsed, ro.active, ro.agent_data, counters, ro.metrics, ro.rewards)
        tool_messages += [over_limit_message(c, self.max_parallel_calls) for c in dropped]
        tool_messages += [_malformed_message(ro.turn - 1, i) for i in range(malformed)]
        if ro.live.images is None:
            refuse_images_without_vision(tool_messages, "a tool result")
        try:
            ro.prompt_ids = ro.live.reply(tool_messages)
            return True
        except TemplateError as exc:
            if len(parsed) + len(dropped) > 1 and self.rt.profile.parallel_tool_calls is False:
                # The model wrote more calls in one turn than the template can render: the trajectory refused
                # the reply (naming the limit); end this rollout, the check reports it, training goes on.
                log.warning("%s: %s; ending the rollout", AGENT_NAME, exc)
                counters["tool/over_template_call_limit"] += 1
                return False
            if not malformed:
                raise
            # Some templates (GPT-OSS, Mistral) only render a tool message that answers a parsed call.
            log.warning(
                "%s: the template cannot render a reply to a malformed tool call; ending the rollout", AGENT_NAME
            )
            counters["tool/malformed_unanswerable"] += malformed
            return False

    async def _refeed(self, ro: _RolloutState, finished: FinishedRollout) -> RefeedResult | None:
        """Step 4a, opt-in (``verl_ext.numerics.refeed_fraction``): re-score an audited rollout on the server that
        sampled it, now, before the next weight update; what became of it is counted in the rollout's counters."""
        if not self.options.numerics.refeed_fraction:
            return None
        return await audit_rollout(
            self.server_manager,
            ro.request_id,
            str(self.config.actor_rollout_ref.rollout.name),
            finished.rollout,
            ro.extra_fields.get("global_steps"),
            self.options.numerics,
            ro.live.counters,
        )

    # -- helpers ----------------------------------------------------------------------------------
    async def _parse(self, ids: list[int], turn: int, counters: Counter[str], active: Mapping[str, Any]) -> ParsedTurn:
        """The turn as ``parse_turn`` reads it: the assistant message for the template (content and every tool call),
        the calls to run, those past ``max_parallel_calls``, and how many tool calls the parser could not read."""
        schemas = [tool.tool_schema for tool in active.values()]
        turned = await parse_turn(
            self.tool_parser,
            ids,
            self.rt.end_of_turn_ids,
            self.rt.renderer.decode,
            schemas,
            turn,
            self.max_parallel_calls,
            generation_prompt=self.rt.profile.generation_prompt_ids,
            call_reader=self.rt.call_reader,
        )
        if turned.derived:
            counters["tool/derived_reads"] += 1
        if turned.disagree:  # verl's parser and the derived reader read other calls (parse_turn took one)
            counters["tool/readings_disagree"] += 1
        if turned.malformed:
            counters[f"tool/{ToolStatus.MALFORMED.value}"] += turned.malformed
        if turned.dropped:
            counters["tool/dropped_over_max_parallel_calls"] += len(turned.dropped)
        return turned

    def _turn_limit(self, assistant_turns: int) -> bool:
        return bool(self.max_assistant_turns and assistant_turns >= self.max_assistant_turns)

    async def _run_tools(
        self,
        parsed: Sequence[ParsedCall],
        active: Mapping[str, Any],
        agent_data: AgentData,
        counters: Counter[str],
        metrics: dict[str, Any],
        rewards: list[float],
    ) -> list[dict[str, Any]]:
        with simple_timer("tool_calls", metrics):
            outcomes = await asyncio.gather(
                *(run_tool(c, active, agent_data.tools_kwargs, agent_data, self.options.tool_timeout_s) for c in parsed)
            )
        outcomes = [self._cap_response(o) for o in outcomes]
        for o in outcomes:
            counters["tool/calls"] += 1
            counters[f"tool/{o.status.value}"] += 1
            if o.reward is not None:
                rewards.append(o.reward)
        return [o.message for o in outcomes]

    def _active_tools(self, kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """verl's per-sample ``extra_info.tool_selection``, as its tool_agent applies it."""
        selection = (kwargs.get("extra_info") or {}).get("tool_selection")
        if not selection or not self.tools:
            return self.tools, self.tool_schemas
        chosen = {name: self.tools[name] for name in selection if name in self.tools}
        return chosen, [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for t in chosen.values()]

    def _cap_response(self, outcome: ToolOutcome) -> ToolOutcome:
        """multi_turn.max_tool_response_length, applied as verl's tool_agent does (left, right or middle)."""
        parts = outcome.message.get("content")
        if isinstance(parts, list):  # images then one text part (image_loop.tool_message): cap the text
            capped = self._cap_response(dataclasses.replace(outcome, message={"content": parts[-1]["text"]}))
            text_part = {**parts[-1], "text": capped.message["content"]}
            return dataclasses.replace(outcome, message={**outcome.message, "content": [*parts[:-1], text_part]})
        text, limit = str(outcome.message.get("content") or ""), self.max_tool_response_length
        if not limit or len(text) <= limit:
            return outcome
        side = self.tool_response_truncate_side
        if side == "left":
            text = "(truncated)..." + text[-limit:]
        elif side == "right":
            text = text[:limit] + "...(truncated)"
        else:
            text = text[: limit // 2] + "...(truncated)..." + text[-(limit // 2) :]
        return dataclasses.replace(outcome, message={**outcome.message, "content": text})


@dataclass
class _RolloutState:
    """What one rollout of ``VerlExtToolAgentLoop.run`` carries from turn to turn."""

    live: LiveRollout  # the rollout itself: its trajectory, engine calls, replies, clock and counters
    active: Mapping[str, Any]  # the tools this sample may call, by name
    prompt_ids: PromptIds  # the next engine call's prompt (a read-only view of the trajectory's stream)
    request_id: str
    params: dict[str, Any]  # sampling params of every call, stop ids merged in
    stop_ids: list[int]
    agent_data: AgentData
    metrics: dict[str, Any]  # the same dict as agent_data's: verl's tools time into it too
    extra_fields: dict[str, Any] = field(default_factory=dict)
    rewards: list[float] = field(default_factory=list)  # tool rewards
    resumed: list[dict[str, Any]] = field(default_factory=list)  # turns an engine resumed after an abort
    attempts: list[tuple[Attempt, ...]] = field(default_factory=list)  # each turn's engine calls (engine_turn)
    turn: int = 0  # assistant turns kept


def training_step(kwargs: Mapping[str, Any], served_weight_version: Any) -> int:
    """The step that trains the rollout (the record's ``step`` and ``versions.trained_step``): v1 passes the trainer
    step whose batch the sample is in; v0 does not, so it is the weight version the engine served + 1 (v0 trains
    on-policy). The versions that served each turn are the record's ``versions`` (``core.version_spans``)."""
    if kwargs.get("global_steps") is not None:
        return int(kwargs["global_steps"])
    return int(served_weight_version or 0) + 1


_SPEC_DECODE_KEYS = ("spec_num_draft_tokens", "spec_num_accepted_tokens", "spec_num_verify_steps")


def merge_engine_extra_fields(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    """Merge one engine call's extra fields as verl's tool_agent does: the first call's as they are, then the
    latest max_global_steps (staleness in v1) and summed speculative-decoding counters."""
    if not into:
        into.update(new)
        return
    if new.get("max_global_steps"):
        into["max_global_steps"] = new["max_global_steps"]
    for key in _SPEC_DECODE_KEYS:
        if key in new and key in into:
            into[key] = int(into[key]) + int(new[key])


def _malformed_message(turn: int, index: int) -> dict[str, Any]:
    return {
        "role": "tool",
        "content": 'Error: a tool call could not be parsed; write a JSON object with "name" and "arguments" '
        "inside the tool-call tags",
        "tool_call_id": call_id(turn, 900 + index),
    }


def plain_index(value: Any) -> Any:
    """A row's ``index`` as a record holds it: an int where it is one, else its text (None: none)."""
    try:
        return int(value)
    except (TypeError, ValueError):
        return None if value is None else str(value)
