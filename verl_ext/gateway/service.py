"""The gateway: sessions on one engine, each request matched, generated, parsed and kept by the token core.

``Gateway.complete`` serves one chat-completions request of a session; ``Gateway.end`` ends a session, checks
every branch and writes its records. The HTTP layer (``verl_ext.gateway.server``) only translates. With ``vision``
(the probed image side of a VL model's processor) a branch is an ``ImageTrajectory``: each image the client sends
is expanded as the processor expands it and handed to the engine with every prompt that holds it; without, a
message holding an image is a 400 naming ``no_images``.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_ext.check.checker import ConsistencyChecker
from verl_ext.core.bounded_cache import LruCache
from verl_ext.core.errors import OptionsError
from verl_ext.core.images import ImageTokens
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.template_profile import TemplateProfile
from verl_ext.core.trajectory import FinishReason, TokenTrajectory
from verl_ext.core.turn_end import stop_text_id
from verl_ext.core.turn_parse import ParsedTurn
from verl_ext.core.version_spans import Attempt
from verl_ext.gateway.branch import Fork
from verl_ext.gateway.conclude import BranchResult, conclude_branch
from verl_ext.gateway.engine import SAMPLING_DEFAULTS, Engine, Sampled, Sampling
from verl_ext.gateway.errors import GatewayError, bad_request, session_finished, unknown_session
from verl_ext.gateway.images import TextOnlyTrajectory
from verl_ext.gateway.parsing import ReasoningMarkers, ReasoningSplit, visible_message
from verl_ext.gateway.request import ChatRequest
from verl_ext.gateway.session import Prepared, Session
from verl_ext.gateway.thinking import check_effort
from verl_ext.gateway.training import BranchTraining
from verl_ext.runtime import LiveRollout, RolloutRuntime
from verl_ext.runtime.rollout_runtime import Records

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
    # What training decided over the request (``Engine.decided_sampling``): setting -> {"requested", "used"}, for
    # each sampling setting the request gave that the engine sampled otherwise; said in the answer, never silent.
    sampling_overridden: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def overridden_header(self) -> dict[str, str]:
        """``X-Verl-Ext-Sampling-Overridden: temperature=0.2->1.0`` where training overrode a setting, else none."""
        if not self.sampling_overridden:
            return {}
        said = "; ".join(f"{k}={v['requested']}->{v['used']}" for k, v in self.sampling_overridden.items())
        return {SAMPLING_OVERRIDDEN_HEADER: said}


SAMPLING_OVERRIDDEN_HEADER = "X-Verl-Ext-Sampling-Overridden"


# How many ended session ids a gateway remembers, to answer a late call on one with a 409 rather than a new session:
# an id and its reason are about 200 bytes, so 100,000 of them hold about 20 MB, while a training run's worker serves
# far fewer sessions between two restarts of the trainer than that.
ENDED_IDS = 100_000
# How long a session may go without a request before it is ended, recorded and counted (``sessions_expired``): longer
# than a weight update and a slow tool call, so that a session is only ended this way when its harness left it.
IDLE_TIMEOUT_S = 3600.0


@dataclass
class GatewayConfig:
    """Limits and policy of a gateway: the token budget per branch (verl's response_length), the branch cap per
    session, whether any new session id opens a session (else ``open`` must be called first: 404), how many ended
    session ids are remembered for a 409 (``ended_ids``), and the idle time after which a session is ended
    (``idle_timeout_s``; None: never)."""

    response_length: int = 1024
    max_branches: int = 8
    open_on_demand: bool = True
    ended_ids: int = ENDED_IDS
    idle_timeout_s: float | None = IDLE_TIMEOUT_S
    counters: Counter[str] = field(default_factory=Counter)


class Gateway:
    """Sessions served on one engine with one chat template (module docstring)."""

    def __init__(
        self,
        engine: Engine,
        runtime: RolloutRuntime,
        reader: Any,
        config: GatewayConfig | None = None,
        *,
        markers: ReasoningMarkers | None = None,
        vision: ImageTokens | None = None,
        no_images: str = "the served model takes no images (a text-only model)",
    ) -> None:
        self.engine = engine
        self.config = config or GatewayConfig()
        self.vision = vision  # the probed image side of the model's processor (None: images are refused)
        self.no_images = no_images  # why images are refused, when they are
        self.runtime = runtime  # the rollout runtime every loop uses: template, check, records (verl_ext.runtime)
        self.reader = reader  # a ToolCallReader (verl_ext.gateway.parsing)
        if getattr(reader, "call_reader", False) is None:  # the template's own reader, where verl's reads no call
            reader.call_reader = runtime.call_reader
        self.markers = markers
        # Open sessions only: an ended session's state goes once its branches are recorded and its results handed to
        # whoever ended it (the in-training loop builds verl's output from them), so a gateway that lives as long as a
        # training job holds what is open, never what it served. What remains of an ended session is its id and why.
        self.sessions: dict[str, Session] = {}
        self.ended: LruCache[str, str] = LruCache("ended gateway sessions", self.config.ended_ids)
        self._active: OrderedDict[str, float] = OrderedDict()  # open session ids, least recently active first

    @property
    def renderer(self) -> ChatRenderer:
        """The runtime's renderer (the template every branch is rendered with)."""
        return self.runtime.renderer

    @property
    def profile(self) -> TemplateProfile:
        """The runtime's template profile."""
        return self.runtime.profile

    @property
    def checker(self) -> ConsistencyChecker:
        """The runtime's consistency check."""
        return self.runtime.checker

    @property
    def writer(self) -> Records | None:
        """Where the runtime writes each branch's record (None: nowhere)."""
        return self.runtime.writer

    @property
    def counters(self) -> Counter[str]:
        """What the gateway counted: ``forks``, ``sessions`` (opened), ``sessions_served`` (ended with a branch: a
        session that reached the engine), ``sessions_expired`` (ended for being idle), ``branches_recorded``,
        ``engine_view_failures`` (branches whose engine view failed), ``turns``, ``calls_past_budget``,
        ``malformed_calls``, ``derived_reads`` (turns read by the reader derived from the template),
        ``readings_disagree`` (turns verl's parser and the derived reader read other calls from),
        ``invalid_engine_output``, ``context_length_exceeded``, ``records/write_failures``."""
        return self.config.counters

    def open(self, session_id: str) -> Session:
        """Open a session (a no-op for one already open); 409 for one that has ended."""
        self.expire_idle()
        session = self.sessions.get(session_id)
        if session is None:
            why = self.ended.get(session_id)
            if why is not None:
                raise session_finished(session_id, why)
            session = Session(session_id, self._new_rollout, max_branches=self.config.max_branches)
            self.sessions[session_id] = session
            self.counters["sessions"] += 1
        elif session.ended:
            raise session_finished(session_id, session.ended)
        self._touch(session_id)
        return session

    def session(self, session_id: str) -> Session:
        """The open session of this id (opened now where any new id opens one); 404 unknown, 409 ended."""
        session = self.sessions.get(session_id)
        if session is None:
            if not self.config.open_on_demand and session_id not in self.ended:
                raise unknown_session(session_id)
            return self.open(session_id)
        if session.ended:
            raise session_finished(session_id, session.ended)
        self._touch(session_id)
        return session

    def expire_idle(self, now: float | None = None) -> int:
        """End every session idle for longer than ``idle_timeout_s`` (a turn in flight is not idle): each is checked,
        recorded and counted (``sessions_expired``) as any ended session; its results are not kept, nobody asked for
        them. Returns how many ended. Called on each open; cost: the expired sessions, not the open ones."""
        timeout = self.config.idle_timeout_s
        if timeout is None:
            return 0
        now = time.monotonic() if now is None else now
        expired = []
        for session_id, last in self._active.items():  # least recently active first: stop at the first recent one
            if now - last <= timeout:
                break
            if not self.sessions[session_id].lock.locked():
                expired.append(session_id)
        for session_id in expired:
            self.end(session_id, f"idle for more than {timeout:g} s: ended by the gateway")
            self.counters["sessions_expired"] += 1
        return len(expired)

    def _touch(self, session_id: str) -> None:
        self._active[session_id] = time.monotonic()
        self._active.move_to_end(session_id)

    async def complete(self, session_id: str, request: ChatRequest) -> Completion:
        """Serve one request: match its history, continue or fork a branch, generate and parse the next turn."""
        session = self.session(session_id)
        async with session.lock:
            if session.ended:
                raise session_finished(session_id, session.ended)
            messages = request.messages if self.markers is None else ReasoningSplit(request.messages, self.markers)
            stop_ids = tuple(sorted(set(self._stop_ids(request.stop)) | set(self.reader.stop_token_ids)))
            self._refuse_unsupported_sampling(request)
            check_effort(
                self.renderer, request.reasoning_effort, request.reasoning_effort_field, request.reasoning_effort_sent
            )
            mark = session.mark()
            try:
                prepared = session.prepare(messages, request.tools)
            except GatewayError:
                if session.ended:
                    self._conclude(session)
                raise
            try:
                done = await self._prepared_turn(session, request, prepared, stop_ids)
                overridden = {**request.overridden, **self._overridden(session_id, request)}
                return dataclasses.replace(done, sampling_overridden=overridden) if overridden else done
            except BaseException:  # a cancelled request too (the client went away): the branch stays consistent
                if not session.ended:  # a client's error found late, or the server's fault: the session as it was
                    session.undo(mark)
                raise

    async def _prepared_turn(
        self, session: Session, request: ChatRequest, prepared: Prepared, stop_ids: tuple[int, ...]
    ) -> Completion:
        """The turn of a prepared request (``complete``): its context checked, its budget, then ``_turn``."""
        branch, prompt = prepared.branch, prepared.prompt
        prompt_length = 0 if prompt is None else len(prompt)
        if prompt is not None:
            self._check_context(prompt_length, request)
        if prepared.fork is not None:
            self.counters["forks"] += 1
            log.info("session %s: branch %d %s", session.id, branch.number, prepared.fork.to_json())
        max_tokens = branch.rollout.budget(
            self.config.response_length,
            requested=request.max_tokens,
            max_context=self.engine.max_context,
            prompt_length=prompt_length,
        )
        if prompt is None or max_tokens <= 0:
            branch.exhausted = True
            self.counters["calls_past_budget"] += 1
            empty = {"role": "assistant", "content": ""}
            return Completion(empty, "length", prompt_length, (), branch.number, prepared.fork)
        return await self._turn(session, prepared, request, prompt, max_tokens, stop_ids)

    async def _turn(
        self,
        session: Session,
        prepared: Prepared,
        request: ChatRequest,
        prompt: Sequence[int],
        max_tokens: int,
        stop_ids: tuple[int, ...],
    ) -> Completion:
        """One turn of the prepared branch through the rollout runtime (``RolloutRuntime.turn``): this gateway's
        engine and tool-call reader as its hooks; the turn kept in the branch's log and trajectory."""
        branch = prepared.branch
        sampling = Sampling(
            max_tokens,
            1.0 if request.temperature is None else request.temperature,
            1.0 if request.top_p is None else request.top_p,
            request.seed,
            stop_ids,
            -1 if request.top_k is None else request.top_k,
            1.0 if request.repetition_penalty is None else request.repetition_penalty,
        )
        parse = bool(request.tools) and request.tool_choice != "none"

        images = branch.rollout.images  # every image of the prompt, in placeholder order (None: no image side)

        async def generate(budget: int) -> Any:
            return await self._generate(session, prompt, sampling, images)

        async def read(ids: Sequence[int]) -> ParsedTurn:
            return await self.reader.read(
                ids,
                self.runtime.end_of_turn_ids,
                request.tools,
                len(branch.turns),
                self.renderer.decode,
                parse,
                self.profile.generation_prompt_ids,
            )

        turn = await branch.rollout.turn(max_tokens, stop_ids, generate, read)
        call = turn.call
        segments = getattr(turn.output, "segments", None)  # the engine's attempts at the turn (for the versions)
        attempts = tuple(Attempt.of(seg) for seg in segments) if segments else None
        label = getattr(turn.output, "label", None)  # the weight label it was served on (the record's trainer entry)
        if turn.parsed is None:
            # Ids the tokenizer cannot decode, NaN/inf logprobs: the trajectory keeps the turn up to the first
            # problem, the check names it, no parser sees the rest, and the branch takes no further turn.
            branch.add_turn(call, None, {"role": "assistant", "content": ""}, attempts, label)
            session.register(branch)
            branch.exhausted = True
            self.counters["invalid_engine_output"] += 1
            empty = {"role": "assistant", "content": ""}
            return Completion(empty, "length", len(prompt), call.output_ids, branch.number, prepared.fork)
        parsed = turn.parsed
        visible = visible_message(parsed.message, self.markers, parsed.calls, parse)
        branch.add_turn(call, parsed.message, visible, attempts, label)
        session.register(branch)
        self.counters["turns"] += 1
        self.counters["malformed_calls"] += parsed.malformed
        self.counters["derived_reads"] += int(parsed.derived)
        self.counters["readings_disagree"] += int(parsed.disagree)
        reason = (
            "length" if turn.finish is FinishReason.LENGTH else "tool_calls" if visible.get("tool_calls") else "stop"
        )
        return Completion(visible, reason, len(prompt), call.output_ids, branch.number, prepared.fork, parsed.malformed)

    def _check_context(self, prompt_length: int, request: ChatRequest) -> None:
        """400 ``context_length_exceeded`` (OpenAI's answer) for a prompt that leaves the engine no room to sample, or
        a client's ``max_tokens`` past the room the prompt leaves (never cut down to fit without a word); the session
        is undone to what it was, so the client may retry with a shorter history or a smaller budget."""
        limit = self.engine.max_context
        if limit is None:
            return
        if prompt_length >= limit:
            self.counters["context_length_exceeded"] += 1
            raise GatewayError(
                400,
                f"the prompt is {prompt_length} tokens and the model's context is {limit} tokens (prompt and output "
                "together): shorten the messages (the session is unchanged: send a shorter history)",
                type="invalid_request_error",
                param="messages",
                code="context_length_exceeded",
            )
        room = limit - prompt_length
        if request.max_tokens is not None and request.max_tokens > room:
            self.counters["context_length_exceeded"] += 1
            field = request.max_tokens_field
            raise GatewayError(
                400,
                f"'{field}' is {request.max_tokens}, but the prompt is {prompt_length} tokens and the model's context "
                f"is {limit} (prompt and output together): {room} tokens are left for the output. Pass '{field}' of "
                f"at most {room}, or shorten the messages (the session is unchanged)",
                type="invalid_request_error",
                param=field,
                code="context_length_exceeded",
            )

    def _overridden(self, session_id: str, request: ChatRequest) -> dict[str, dict[str, Any]]:
        """Each sampling setting the request gave that the engine samples otherwise (an engine whose settings a
        trainer decides says them, ``Engine.decided_sampling``): its requested and used value."""
        decided = getattr(self.engine, "decided_sampling", None)
        if decided is None:
            return {}
        used = decided(session_id)
        out: dict[str, dict[str, Any]] = {}
        for name in ("temperature", "top_p", "top_k", "seed"):
            asked = getattr(request, name)
            if asked is not None and used.get(name) != asked:
                out[name] = {"requested": asked, "used": used.get(name)}
        return out

    def _refuse_unsupported_sampling(self, request: ChatRequest) -> None:
        """400 for a sampling option the engine cannot honour (``Engine.unsupported_sampling``), before any change."""
        for name in getattr(self.engine, "unsupported_sampling", ()):
            value = getattr(request, name, None)
            if value is not None and value != SAMPLING_DEFAULTS.get(name):
                raise bad_request(
                    name,
                    f"'{name}' is not served by this gateway's engine ({type(self.engine).__name__}); leave it out",
                    "unsupported",
                )

    async def _generate(
        self, session: Session, prompt: Sequence[int], sampling: Sampling, images: Sequence[Any] | None = None
    ) -> Any:
        """The engine's turn for ``prompt`` (with its images, when it holds any; ``images`` None: a text branch); an
        engine that fails ends the session (its record says why) with a 503. Its ``images`` are the images the
        engine call was given (the engine's own account where it gives one), for the call's record."""
        try:
            if images:
                out = await self.engine.generate(prompt, sampling, images=list(images))
            else:
                out = await self.engine.generate(prompt, sampling)
        except Exception as exc:
            session.ended = f"the engine failed: {type(exc).__name__}: {exc}"
            self._conclude(session)
            raise GatewayError(503, session.ended, type="server_error", code="engine_error") from exc
        if images is None or getattr(out, "images", None) is not None:
            return out  # a text branch (nothing to record), or the engine said what it passed on
        # the engine call's record keeps the digests of what the engine was handed
        if isinstance(out, Sampled):
            return dataclasses.replace(out, images=tuple(images))
        return Sampled(tuple(out.token_ids), None if out.log_probs is None else tuple(out.log_probs), tuple(images))

    def end(
        self,
        session_id: str,
        why: str = "ended by the client",
        training: Mapping[int, BranchTraining] | None = None,
    ) -> list[BranchResult]:
        """End a session: check every branch and write its record, then release the session (its id is kept, to
        answer a late call with a 409). The results are the caller's: the gateway keeps none. Ending an ended
        session returns nothing new. ``training``: branch number -> what a trainer trains of it (``plan_training``;
        the agent loop's), recorded with each branch and applied to its result's ``trained_mask``."""
        session = self.sessions.get(session_id)
        if session is None:
            if session_id in self.ended:
                return []
            raise unknown_session(session_id, ended_kept=self.config.ended_ids)
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
        self.sessions.pop(session.id, None)
        self._active.pop(session.id, None)
        self.ended[session.id] = session.ended or "ended"
        out = []
        for branch in session.branches:
            result = conclude_branch(
                branch,
                session.id,
                session.ended or "",
                self.counters,
                response_length=self.config.response_length,
                row=session.row,
                training=None if training is None else training.get(branch.number),
            )
            if result is not None:
                out.append(result)
        self.counters["sessions_served"] += int(bool(out))
        self.counters["branches_recorded"] += len(out)
        self.counters["engine_view_failures"] += sum(1 for r in out if not r.result.engine_ok)
        return out

    def _new_rollout(self, clock: str | None) -> LiveRollout:
        """A branch's rollout on ``clock`` (its session's; None: now): images expanded with the image side, or
        refused with a 400 naming ``no_images``."""
        return self.runtime.rollout(self.vision, text_only=self._text_only, clock=clock)

    def _text_only(self, renderer: ChatRenderer, profile: TemplateProfile) -> TokenTrajectory:
        return TextOnlyTrajectory(renderer, profile, self.no_images)

    def _stop_ids(self, stops: Sequence[str]) -> list[int]:
        try:
            return [stop_text_id(self.renderer.encode, stop, "stop") for stop in stops]
        except OptionsError as exc:
            raise bad_request("stop", str(exc), "unsupported") from None
