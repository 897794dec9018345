"""``LiveRollout``: one rollout from its start to its conclusion, the one object every loop and the gateway drive.

``RolloutRuntime.rollout`` makes one, with its image side (a text trajectory, one that expands images, or the
caller's text-only one that refuses them) and its template clock (pinned there, once: every render of the rollout,
its check and its replay read that time). Then:

- ``start`` renders the first prompt (the only render of a prompt's text); a loop that renders its own tokens (verl's
  stock loop under audit) calls ``watch`` instead: the prompt's messages and tools are noted, the clock pinned, and
  no trajectory is kept;
- each turn is ``turn`` (the caller's engine and reader as hooks, ``RolloutRuntime.turn``) then ``keep``; each
  reply (tool results, a user's message) is ``reply``; a watched loop ``record``\\ s each engine call it made;
- ``finish`` assembles the ``Rollout`` the check, the metrics and the record get (with the images a trainer gets:
  no image cut in two), and ``num_turns`` as verl's tool_agent counts them; given the trainer that drives the loop
  (``TrainerClock``: ``plugin.trainer_mode.TrainerMode``), the record's ``trainer`` entry from the weight label each
  engine call was served on (``keep``/``record``'s ``label``), its ``tito/trainer/*`` counts, and the trainer's sync
  convention in the versions, so every lag of the rollout is read one way;
- ``trainer_mask``, once a trainer takes the rollout (every in-training loop, before it concludes): the response mask
  the trainer gets, with every sampled token older than the runtime's ``max_token_lag`` masked out, and the rollout's
  ``tito/async/*`` counters (``telemetry.async_metrics``) in its ``counters``: one place for the three loops;
- ``conclude`` (a loop: check, record, report, enforce) or ``judge`` (the gateway: check and record only) ends it;
  what the conclusion counts (records not written, thumbnails not written) goes to the rollout's ``counters``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from verl_ext.check.findings import CheckResult
from verl_ext.check.inputs import EngineCall, EngineCalls, TrainerSample, trainer_sample_from_trajectory
from verl_ext.check.record import Rollout
from verl_ext.core.errors import TrajectoryError
from verl_ext.core.image_trajectory import ImageTrajectory
from verl_ext.core.prompt_ids import PromptIds
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.sync_labels import SyncLabel
from verl_ext.core.template_profile import TemplateProfile
from verl_ext.core.trajectory import FinishReason, TokenTrajectory
from verl_ext.core.turn_parse import ParsedTurn
from verl_ext.core.version_spans import RolloutVersions, stale_mask
from verl_ext.runtime.images import image_sample
from verl_ext.runtime.turn import G, Turn, keep_sampled, turn_budget
from verl_ext.telemetry.async_metrics import version_counters


class Runtime(Protocol):
    """What a rollout is driven through: ``RolloutRuntime`` (its template, its turn, its end)."""

    renderer: ChatRenderer
    profile: TemplateProfile
    max_token_lag: int | None  # verl_ext.max_token_lag: older sampled tokens get loss mask 0 (None: off)

    async def turn(
        self,
        calls: EngineCalls,
        prompt_ids: Sequence[int],
        max_tokens: int,
        stop_ids: Sequence[int],
        generate: Callable[[int], Awaitable[G]],
        read: Callable[[Sequence[int]], Awaitable[ParsedTurn]],
    ) -> Turn[G]: ...

    def engine_call(
        self,
        calls: EngineCalls,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        logprobs: Sequence[float] | None,
        max_tokens: int,
        stop_ids: Sequence[int],
    ) -> tuple[EngineCall, FinishReason]: ...

    def conclude(self, rollout: Rollout, counters: Counter[str]) -> CheckResult: ...

    def judge(self, rollout: Rollout, counters: Counter[str]) -> CheckResult: ...


class TrainerClock(Protocol):
    """The trainer a rollout runs under, as the record's ``trainer`` entry needs it (``plugin.trainer_mode``)."""

    @property
    def sync(self) -> SyncLabel: ...

    def rollout_staleness(self, served: Sequence[Any], trained_step: int | None) -> dict[str, Any]: ...

    def staleness_counters(self, entry: Mapping[str, Any]) -> Mapping[str, float]: ...


@dataclass(frozen=True)
class FinishedRollout:
    """A finished rollout: what the check and the record get (``rollout``), the images a trainer gets with its
    sample (``{"images": [...]}``, the list the record's image evidence was computed from; None without images) and
    its turns as verl counts them (the prompt, each assistant turn, each reply)."""

    rollout: Rollout
    multi_modal_data: dict[str, list[Any]] | None
    num_turns: int

    @property
    def sample(self) -> TrainerSample:
        return self.rollout.sample


class LiveRollout:
    """One rollout in progress (module docstring). Made by ``RolloutRuntime.rollout``."""

    def __init__(self, runtime: Runtime, trajectory: TokenTrajectory | None, clock: str | None) -> None:
        self.runtime = runtime
        self.trajectory = trajectory  # None: a watched loop, whose tokens are its own
        self._clock = clock
        self.calls = EngineCalls()  # each engine call, its prompt kept as what it adds: O(stream) ids per rollout
        self.replies = 0  # replies appended after a turn (tool results, a user's message)
        self.first_messages: tuple[Mapping[str, Any], ...] = ()
        self.tools: list[dict[str, Any]] | None = None
        self.first_prompt = 0  # tokens in the first prompt (the response budget counts from there)
        self.served: list[Any] = []  # per engine call, the weight label it was served on (verl's global_steps)
        self.counters: Counter[str] = Counter()  # what the rollout counted (its conclusion's failed writes too)

    # -- start -----------------------------------------------------------------------------------------
    def start(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> PromptIds:
        """Render the first prompt (generation prompt included) with the rollout's clock; returns its ids."""
        prompt = self._trajectory("start").start([dict(m) for m in messages], tools)
        self._note_prompt(messages, tools)
        self.first_prompt = len(prompt)
        return prompt

    def watch(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> None:
        """For a loop that renders its own tokens: note the messages and tools its first prompt rendered, at any time
        before ``finish`` (the clock was pinned when the rollout was made, as the loop rendered its prompt)."""
        if self.trajectory is not None:
            raise TrajectoryError(
                "watch() is for a rollout without a trajectory (RolloutRuntime.rollout(watched=True))"
            )
        self._note_prompt(messages, tools)

    def _note_prompt(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> None:
        self.first_messages = tuple(messages)
        self.tools = [dict(t) for t in tools] if tools else None

    # -- turns -----------------------------------------------------------------------------------------
    @property
    def clock(self) -> str | None:
        """The time the template's ``strftime_now`` reads in this rollout (None: its template reads no clock)."""
        return self._clock if self.trajectory is None else self.trajectory.clock

    @property
    def response_tokens(self) -> int:
        """Tokens after the first prompt: what the response budget counts."""
        return len(self._trajectory("response_tokens").input_ids) - self.first_prompt

    @property
    def images(self) -> list[Any] | None:
        """Every image of the stream so far, in placeholder order (None: a rollout without an image side)."""
        return self.trajectory.images if isinstance(self.trajectory, ImageTrajectory) else None

    def prompt_ids(self) -> PromptIds:
        """The next engine call's prompt: the whole stream so far (a read-only view)."""
        return self._trajectory("prompt_ids").prompt_ids()

    def budget(
        self,
        response_length: int,
        *,
        requested: int | None = None,
        max_context: int | None = None,
        prompt_length: int = 0,
    ) -> int:
        """What the next turn may sample (``turn_budget``): at most 0 means no turn."""
        return turn_budget(
            response_length,
            self.response_tokens,
            requested=requested,
            max_context=max_context,
            prompt_length=prompt_length,
        )

    async def turn(
        self,
        max_tokens: int,
        stop_ids: Sequence[int],
        generate: Callable[[int], Awaitable[G]],
        read: Callable[[Sequence[int]], Awaitable[ParsedTurn]],
    ) -> Turn[G]:
        """One turn on the current prompt through the caller's engine and reader (``RolloutRuntime.turn``); the
        caller keeps it (``keep``) or drops it."""
        return await self.runtime.turn(self.calls, self.prompt_ids(), max_tokens, stop_ids, generate, read)

    def keep(self, call: EngineCall, message: Mapping[str, Any] | None, label: Any = None) -> None:
        """Keep an engine call's output as sampled, with the message it parses to (None: an invalid output, kept up
        to its first problem), and log the call; ``label``: the weight label the engine served it on (verl's
        ``global_steps``; None: it gave none)."""
        keep_sampled(self._trajectory("keep"), call, message)
        self.calls.append(call)
        self.served.append(label)

    def reply(self, messages: Sequence[Mapping[str, Any]]) -> PromptIds:
        """Append the messages after a turn (tool results, a user's message) as context tokens; returns the next
        prompt. A template that cannot render them raises (``TemplateError``) and nothing is counted."""
        prompt = self._trajectory("reply").append_messages([dict(m) for m in messages])
        self.replies += 1
        return prompt

    def record(
        self,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        logprobs: Sequence[float] | None,
        max_tokens: int,
        stop_ids: Sequence[int],
        label: Any = None,
    ) -> EngineCall:
        """For a watched loop: log one engine call it made, as it returned (before the loop reads its output);
        ``label`` as for ``keep``."""
        call, _ = self.runtime.engine_call(self.calls, prompt_ids, output_ids, logprobs, max_tokens, stop_ids)
        self.calls.append(call)
        self.served.append(label)
        return call

    @property
    def num_turns(self) -> int:
        """The rollout's turns as verl's tool_agent counts them: the prompt, each assistant turn, each reply."""
        return 1 + len(self.calls) + self.replies

    # -- finish ----------------------------------------------------------------------------------------
    def finish(
        self,
        *,
        response_length: int | None,
        step: int = 0,
        extra: Mapping[str, Any] | None = None,
        sample: TrainerSample | None = None,
        messages: Sequence[Mapping[str, Any]] | None = None,
        versions: RolloutVersions | None = None,
        trainer: TrainerClock | None = None,
    ) -> FinishedRollout:
        """Finish the trajectory and assemble the rollout: the trainer sample cut at ``response_length`` (before an
        image the cut would split), the messages (images as digests), the stream's kinds and repairs, the clock,
        ``step``, the engine calls' ``versions`` and the caller's ``extra`` record keys (the image view's evidence
        added). A watched loop passes its own ``sample`` and ``messages`` (its tokens are not the runtime's: no kinds,
        no repairs). ``trainer``: the trainer driving the loop (None: none, as the standalone gateway): the record's
        ``trainer`` entry, its counts in ``counters``, its sync convention in ``versions``."""
        extra, versions = self._trainer_entry(trainer, step, extra, versions)
        if self.trajectory is None:
            if sample is None or messages is None:
                raise TrajectoryError("finish() of a watched rollout needs the loop's sample and messages")
            rollout = self._rollout(sample, messages, step, extra, response_length, versions=versions)
            return FinishedRollout(rollout, None, self.num_turns)
        t = self.trajectory
        t.finish()
        images: dict[str, Any] = {}
        multi_modal_data = None
        pixels: Mapping[str, Any] = {}
        if isinstance(t, ImageTrajectory):  # no image cut in two; the record holds digests, the image view's evidence
            cut = image_sample(t, response_length)
            sample, record_messages = cut.sample, cut.record_messages
            images, pixels, multi_modal_data = {"images": cut.record_images}, cut.pixels, cut.multi_modal_data
        else:
            sample, record_messages = trainer_sample_from_trajectory(t, response_length), t.messages
        rollout = self._rollout(
            sample,
            record_messages,
            step,
            {**(extra or {}), **images},
            response_length,
            kinds=t.kind_values(len(sample.stream)),
            repairs=Counter(e.kind.value for e in t.edits),
            repair_log=t.repair_log(),
            pixels=pixels,
            versions=versions,
        )
        return FinishedRollout(rollout, multi_modal_data, self.num_turns)

    def _trainer_entry(
        self,
        trainer: TrainerClock | None,
        step: int,
        extra: Mapping[str, Any] | None,
        versions: RolloutVersions | None,
    ) -> tuple[Mapping[str, Any] | None, RolloutVersions | None]:
        """The caller's ``extra`` with the ``trainer`` entry and ``versions`` with the trainer's sync convention (both
        as given without a trainer); the entry's counts go to the rollout's counters."""
        if trainer is None:
            return extra, versions
        entry = trainer.rollout_staleness(self.served, step)
        self.counters.update(trainer.staleness_counters(entry))
        if versions is not None:
            versions = replace(versions, sync=trainer.sync)
        return {**(extra or {}), "trainer": entry}, versions

    def _rollout(
        self,
        sample: TrainerSample,
        messages: Sequence[Mapping[str, Any]],
        step: int,
        extra: Mapping[str, Any] | None,
        response_length: int | None,
        **trajectory: Any,
    ) -> Rollout:
        """The one assembly of a ``Rollout``; ``trajectory``: what only the runtime's own trajectory tells (kinds,
        repairs, pixels)."""
        return Rollout.of(
            self.calls,
            sample,
            messages,
            self.tools,
            prompt_messages=len(self.first_messages),
            response_length=response_length,
            step=step,
            chat_template_kwargs=self.runtime.renderer.template_kwargs,
            template_clock=self.clock,  # the time the template read: the check and replay render with it
            extra=extra,
            **trajectory,
        )

    # -- what a trainer gets ---------------------------------------------------------------------------
    def trainer_mask(
        self, finished: FinishedRollout, mask: Sequence[int] | None = None, turns: Sequence[int] | None = None
    ) -> list[int]:
        """The response mask a trainer gets of ``finished`` (call it once, before its conclusion reports the
        counters): ``mask`` (what the trainer trains of it; default the sample's) with 0 on every sampled token whose
        version lags the trained step by more than the runtime's ``max_token_lag`` (``core.version_spans
        .stale_mask``; off: ``mask`` as it is), and the rollout's ``tito/async/*`` counters in ``counters``: its
        versions over the engine calls ``turns`` (indices; default all: a gateway branch counts the turns it trains,
        so a call replayed into a fork counts once) and the tokens masked here. The record keeps the sampled mask."""
        rollout, sample = finished.rollout, finished.sample
        base = list(sample.response_mask if mask is None else mask)
        starts = [c.output_start for c in rollout.calls]
        lag = self.runtime.max_token_lag
        out, masked = stale_mask(rollout.versions, starts, base, len(sample.prompt_ids), lag)
        versions = rollout.versions
        if versions is not None and turns is not None:
            versions = replace(versions, calls=tuple(versions.calls[i] for i in turns))
        self.counters.update(version_counters(versions, masked))
        return base if out is None else out

    # -- conclude --------------------------------------------------------------------------------------
    def conclude(self, finished: FinishedRollout) -> CheckResult:
        """A loop's end: check, record, report the metrics with the rollout's counters, apply the policy
        (``RolloutRuntime.conclude``)."""
        return self.runtime.conclude(finished.rollout, self.counters)

    def judge(self, finished: FinishedRollout) -> CheckResult:
        """The gateway's end: check and record only (it reports and enforces per training sample); a failed write is
        counted in the rollout's counters."""
        return self.runtime.judge(finished.rollout, self.counters)

    def _trajectory(self, what: str) -> TokenTrajectory:
        if self.trajectory is None:
            raise TrajectoryError(f"{what}() needs the rollout's trajectory; a watched rollout has none")
        return self.trajectory
