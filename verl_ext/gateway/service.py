"""The gateway: sessions on one engine, each request matched, generated, parsed and kept by the token core.

``Gateway.complete`` serves one chat-completions request of a session; ``Gateway.end`` ends a session, checks
every branch and writes its records. The HTTP layer (``verl_ext.gateway.server``) only translates.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_ext.check.checker import ConsistencyChecker
from verl_ext.check.inputs import EngineCall
from verl_ext.core.call_reader import learn_call_reader
from verl_ext.core.engine_output import validate_engine_output
from verl_ext.core.probe import TemplateProfile
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.trajectory import FinishReason, TokenTrajectory
from verl_ext.core.turn_end import end_of_turn_ids, judge_finish
from verl_ext.gateway.branch import Fork
from verl_ext.gateway.conclude import BranchResult, conclude_branch
from verl_ext.gateway.engine import Engine, Sampling
from verl_ext.gateway.errors import GatewayError, bad_request, session_finished, unknown_session
from verl_ext.gateway.parsing import ReasoningMarkers, ReasoningSplit, visible_message
from verl_ext.gateway.request import ChatRequest
from verl_ext.gateway.session import Session
from verl_ext.gateway.training import BranchTraining
from verl_ext.telemetry.records import RecordWriter

log = logging.getLogger("verl_ext.gateway")


@dataclass(frozen=True)
class Completion:
    """One served turn: the assistant message as the client gets it, and its accounting."""

    message: dict[str, Any]
    finish_reason: str  # "stop" | "tool_calls" | "length"
    prompt_tokens: int
    token_ids: tuple[int, ...]
    branch: int
    fork: Fork | None
    malformed_calls: int = 0  # tool-call blocks the parser could not read (left out of content and tool_calls)


@dataclass
class GatewayConfig:
    """Limits and policy of a gateway: the token budget per branch (verl's response_length), the branch cap per
    session, and whether any new session id opens a session (else ``open`` must be called first: 404)."""

    response_length: int = 1024
    max_branches: int = 8
    open_on_demand: bool = True
    counters: Counter[str] = field(default_factory=Counter)


class Gateway:
    """Sessions served on one engine with one chat template (module docstring)."""

    def __init__(
        self,
        engine: Engine,
        renderer: ChatRenderer,
        profile: TemplateProfile,
        reader: Any,
        config: GatewayConfig | None = None,
        *,
        checker: ConsistencyChecker | None = None,
        writer: RecordWriter | None = None,
        markers: ReasoningMarkers | None = None,
    ) -> None:
        self.engine = engine
        self.renderer = renderer
        self.profile = profile
        self.reader = reader  # a ToolCallReader (verl_ext.gateway.parsing)
        if getattr(reader, "call_reader", False) is None:  # the template's own reader, where verl's reads no call
            reader.call_reader = learn_call_reader(renderer, profile).reader
        self.config = config or GatewayConfig()
        self.checker = checker or ConsistencyChecker(renderer, profile)
        self.writer = writer
        self.markers = markers
        self.sessions: dict[str, Session] = {}
        self.results: list[BranchResult] = []
        self._end_ids = end_of_turn_ids(profile)

    @property
    def counters(self) -> Counter[str]:
        """What the gateway counted: ``forks``, ``sessions``, ``turns``, ``calls_past_budget``,
        ``malformed_calls``, ``derived_reads`` (turns read by the reader derived from the template),
        ``invalid_engine_output``."""
        return self.config.counters

    def open(self, session_id: str) -> Session:
        """Open a session (a no-op for one already open); 409 for one that has ended."""
        session = self.sessions.get(session_id)
        if session is None:
            session = Session(session_id, self._new_trajectory, max_branches=self.config.max_branches)
            self.sessions[session_id] = session
            self.counters["sessions"] += 1
        elif session.ended:
            raise session_finished(session_id, session.ended)
        return session

    def session(self, session_id: str) -> Session:
        """The open session of this id (opened now where any new id opens one); 404 unknown, 409 ended."""
        session = self.sessions.get(session_id)
        if session is None:
            if not self.config.open_on_demand:
                raise unknown_session(session_id)
            return self.open(session_id)
        if session.ended:
            raise session_finished(session_id, session.ended)
        return session

    async def complete(self, session_id: str, request: ChatRequest) -> Completion:
        """Serve one request: match its history, continue or fork a branch, generate and parse the next turn."""
        session = self.session(session_id)
        async with session.lock:
            if session.ended:
                raise session_finished(session_id, session.ended)
            messages = request.messages if self.markers is None else ReasoningSplit(request.messages, self.markers)
            stop_ids = tuple(sorted(set(self._stop_ids(request.stop)) | set(self.reader.stop_token_ids)))
            try:
                prepared = session.prepare(messages, request.tools)
            except GatewayError:
                if session.ended:
                    self._conclude(session)
                raise
            if prepared.fork is not None:
                self.counters["forks"] += 1
                log.info("session %s: branch %d %s", session_id, prepared.branch.number, prepared.fork.to_json())
            branch, prompt = prepared.branch, prepared.prompt
            max_tokens = self._max_tokens(request, branch.response_tokens, 0 if prompt is None else len(prompt))
            if prompt is None or max_tokens <= 0:
                branch.exhausted = True
                self.counters["calls_past_budget"] += 1
                empty = {"role": "assistant", "content": ""}
                return Completion(
                    empty, "length", 0 if prompt is None else len(prompt), (), branch.number, prepared.fork
                )
            sampling = Sampling(
                max_tokens,
                1.0 if request.temperature is None else request.temperature,
                1.0 if request.top_p is None else request.top_p,
                request.seed,
                stop_ids,
            )
            sampled = await self._generate(session, prompt, sampling)
            finish = judge_finish(sampled.token_ids, max_tokens, stop_ids, self.profile)
            call = EngineCall.of(prompt, sampled.token_ids, sampled.log_probs, finish.value)
            if self._invalid(call):
                # Ids the tokenizer cannot decode, NaN/inf logprobs: the trajectory keeps the turn up to the first
                # problem, the check names it, no parser sees the rest, and the branch takes no further turn.
                branch.add_turn(call, None, {"role": "assistant", "content": ""})
                session.register(branch)
                branch.exhausted = True
                self.counters["invalid_engine_output"] += 1
                empty = {"role": "assistant", "content": ""}
                return Completion(empty, "length", len(prompt), call.output_ids, branch.number, prepared.fork)
            parse = bool(request.tools) and request.tool_choice != "none"
            turn = await self.reader.read(
                call.output_ids,
                self._end_ids,
                request.tools,
                len(branch.turns),
                self.renderer.decode,
                parse,
                self.profile.generation_prompt_ids,
            )
            visible = visible_message(turn.message, self.markers, turn.calls, parse)
            branch.add_turn(call, turn.message, visible)
            session.register(branch)
            self.counters["turns"] += 1
            self.counters["malformed_calls"] += turn.malformed
            self.counters["derived_reads"] += int(turn.derived)
            reason = (
                "length" if finish is FinishReason.LENGTH else "tool_calls" if visible.get("tool_calls") else "stop"
            )
            return Completion(
                visible, reason, len(prompt), call.output_ids, branch.number, prepared.fork, turn.malformed
            )

    async def _generate(self, session: Session, prompt: Sequence[int], sampling: Sampling) -> Any:
        """The engine's turn for ``prompt``; an engine that fails ends the session (its record says why) with a 503."""
        try:
            return await self.engine.generate(prompt, sampling)
        except Exception as exc:
            session.ended = f"the engine failed: {type(exc).__name__}: {exc}"
            self._conclude(session)
            raise GatewayError(503, session.ended, type="server_error", code="engine_error") from exc

    def end(
        self,
        session_id: str,
        why: str = "ended by the client",
        training: Mapping[int, BranchTraining] | None = None,
    ) -> list[BranchResult]:
        """End a session: check every branch and write its record. Ending an ended session returns nothing new.
        ``training``: branch number -> what a trainer trains of it (``plan_training``; the agent loop's), recorded
        with each branch and applied to its result's ``trained_mask``."""
        session = self.sessions.get(session_id)
        if session is None:
            raise unknown_session(session_id)
        if session.concluded:
            return []
        session.ended = session.ended or why
        return self._conclude(session, training)

    def end_all(self, why: str = "the gateway shut down") -> list[BranchResult]:
        """End every open session (on shutdown): nothing served goes unrecorded."""
        out: list[BranchResult] = []
        for session_id, session in list(self.sessions.items()):
            if not session.concluded:
                out += self.end(session_id, why)
        return out

    def _conclude(self, session: Session, training: Mapping[int, BranchTraining] | None = None) -> list[BranchResult]:
        session.concluded = True
        out = []
        for branch in session.branches:
            result = conclude_branch(
                branch,
                session.id,
                session.ended or "",
                self.checker,
                self.writer,
                response_length=self.config.response_length,
                training=None if training is None else training.get(branch.number),
            )
            if result is not None:
                out.append(result)
        self.results += out
        return out

    def _invalid(self, call: EngineCall) -> bool:
        """Whether the engine's output has a problem the trajectory would cut (the agent loop's own test)."""
        problems = validate_engine_output(
            call.output_ids, call.logprobs, self.renderer.vocab_size, stop_ids=self.profile.stop_id_set
        )
        return bool(problems)

    def _new_trajectory(self) -> TokenTrajectory:
        return TokenTrajectory(self.renderer, self.profile)

    def _max_tokens(self, request: ChatRequest, spent: int, prompt_length: int) -> int:
        left = self.config.response_length - spent
        wanted = left if request.max_tokens is None else min(request.max_tokens, left)
        if self.engine.max_context is not None:
            wanted = min(wanted, self.engine.max_context - prompt_length)
        return wanted

    def _stop_ids(self, stops: Sequence[str]) -> list[int]:
        ids = []
        for stop in stops:
            encoded = self.renderer.encode(stop)
            if len(encoded) != 1:
                raise bad_request(
                    "stop",
                    f"stop {stop!r} is {len(encoded)} tokens; the gateway stops on single tokens only (a stop string "
                    "would cut the engine's ids mid-token)",
                    "unsupported",
                )
            ids.append(encoded[0])
        return ids
