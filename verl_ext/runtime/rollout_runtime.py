"""``RolloutRuntime``: what every rollout of one template shares (renderer, profile, check, policy, records), and
the runtime API a loop or the gateway calls on it (``verl_ext.runtime``'s docstring)."""

from __future__ import annotations

import functools
import logging
import os
import re
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from verl_ext.check.checker import ConsistencyChecker
from verl_ext.check.findings import CheckResult
from verl_ext.check.inputs import EngineCall, EngineCalls
from verl_ext.check.policy import CheckMode, CheckPolicy, Enforcer
from verl_ext.check.record import Rollout, RolloutRecord
from verl_ext.core.call_reader import CallReader, learn_call_reader
from verl_ext.core.engine_output import OutputProblem, validate_engine_output
from verl_ext.core.errors import TemplateError
from verl_ext.core.image_trajectory import ImageTrajectory
from verl_ext.core.images import ImageTokens
from verl_ext.core.probe import probe_template
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.template_profile import Severity, TemplateProfile, Verdict
from verl_ext.core.trajectory import FinishReason, TokenTrajectory
from verl_ext.core.turn_end import end_of_turn_ids, judge_finish
from verl_ext.core.turn_parse import ParsedTurn
from verl_ext.runtime.rollout import LiveRollout
from verl_ext.runtime.turn import G, Turn
from verl_ext.telemetry.records import RecordWriter, header_record
from verl_ext.telemetry.thumbnails import ThumbnailWriter, thumbnails_folder

log = logging.getLogger("verl_ext.runtime")

WRITE_FAILURES = "records/write_failures"  # the counter (tito/records/write_failures) of records not written
THUMBNAIL_FAILURES = "records/thumbnail_failures"  # images of written records whose thumbnail was not written


class Records(Protocol):
    """Where records go: a ``RecordWriter``, or a stand-in of one (a test's)."""

    @property
    def path(self) -> Any: ...

    def write(self, record: RolloutRecord) -> None: ...


MetricsSink = Callable[[CheckResult, Mapping[str, float]], None]
TextTrajectory = Callable[[ChatRenderer, TemplateProfile], TokenTrajectory]  # a caller's text-only trajectory


@dataclass
class RolloutRuntime:
    """One template's runtime, built once (``build``) and shared by every rollout of a process."""

    renderer: ChatRenderer
    profile: TemplateProfile
    checker: ConsistencyChecker
    enforcer: Enforcer
    writer: Records | None = None
    sink: MetricsSink | None = None  # where each concluded rollout's metrics go (None: nowhere)
    record_failures_logged: set[str] = field(default_factory=set)  # the causes already logged in this process
    thumbnails: ThumbnailWriter | None = None  # each image's thumbnail beside the records (None: off, or no records)
    max_token_lag: int | None = None  # verl_ext.max_token_lag (LiveRollout.trainer_mask; None: off)

    # -- build ---------------------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        renderer: ChatRenderer,
        *,
        extra_stop_ids: Sequence[int] = (),
        policy: CheckPolicy | None = None,
        records_dir: str | os.PathLike[str] | None = None,
        records_prefix: str = "rollouts",
        max_bytes: int | None = None,
        max_files: int | None = None,
        thumbnails: bool = True,
        sink: MetricsSink | None = None,
        who: str = "verl_ext",
        max_token_lag: int | None = None,
    ) -> RolloutRuntime:
        """Probe ``renderer``'s template (with the caller's stop ids) and build the check, the policy's enforcer and
        the record writer (``records_dir`` None: no records; one file per template profile, named
        ``{records_prefix}-{fingerprint}``: its header is right), with a thumbnail per distinct image in
        ``records_dir/thumbnails`` unless ``thumbnails`` is false (``verl_ext.telemetry.thumbnails``). Raises
        ``TemplateError`` naming ``who`` when the template's verdict is unsupported. ``max_token_lag``: what
        ``LiveRollout.trainer_mask`` masks (``verl_ext.max_token_lag``; None: off)."""
        profile = probe_template(renderer, extra_stop_ids)
        if profile.verdict is Verdict.UNSUPPORTED:
            reasons = "; ".join(r.text for r in profile.reasons if r.severity is Severity.UNSUPPORTED)
            given = renderer.template_file  # --chat-template: the file is at fault, not the tokenizer's own
            which = f"{given!r} (over the tokenizer {renderer.name!r})" if given else f"of {renderer.name!r}"
            audit = f"{renderer.name} --chat-template {given}" if given else renderer.name
            raise TemplateError(
                f"{who}: the chat template {which} is unsupported: {reasons}. "
                f"Run `verl-ext check-template {audit}` for the full audit."
            )
        policy = policy or CheckPolicy()
        writer = thumbs = None
        if records_dir is not None and str(records_dir):
            limits = {k: v for k, v in (("max_bytes", max_bytes), ("max_files", max_files)) if v is not None}
            writer = RecordWriter(
                records_dir, header_record(profile), prefix=f"{records_prefix}-{profile.fingerprint}", **limits
            )
            if thumbnails:  # a process's thumbnails take at most what one of its record files may
                thumbs = ThumbnailWriter(thumbnails_folder(records_dir), max_total_bytes=writer.max_bytes)
        checker = ConsistencyChecker(renderer, profile, policy)
        return cls(
            renderer, profile, checker, Enforcer(policy), writer, sink, thumbnails=thumbs, max_token_lag=max_token_lag
        )

    def with_writer(self, writer: Records | None) -> RolloutRuntime:
        """The same runtime writing its records through ``writer``."""
        return replace(self, writer=writer, record_failures_logged=set())

    # -- a rollout's turns -----------------------------------------------------------------------------
    def new_trajectory(self) -> TokenTrajectory:
        """An empty token trajectory for one rollout (its ``start`` renders the first prompt)."""
        return TokenTrajectory(self.renderer, self.profile)

    def rollout(
        self,
        images: ImageTokens | None = None,
        *,
        text_only: TextTrajectory | None = None,
        clock: str | None = None,
        watched: bool = False,
    ) -> LiveRollout:
        """A new rollout (``LiveRollout``): its trajectory expands images with ``images`` (a VL model's probed image
        side), or is ``text_only`` (the caller's text trajectory, built from the renderer and profile: the gateway's
        refuses an image with a 400) or a plain one; ``clock``: the time its template reads (a fork shares its
        session's), else now where the template reads one. ``watched``: no trajectory, for a loop that renders its
        own tokens (the clock is pinned all the same)."""
        renderer = self.renderer.with_clock(clock) if clock is not None else self.renderer.pinned()
        if watched:
            return LiveRollout(self, None, renderer.clock)
        if images is not None:
            trajectory: TokenTrajectory = ImageTrajectory(renderer, self.profile, image_tokens=images)
        elif text_only is not None:
            trajectory = text_only(renderer, self.profile)
        else:
            trajectory = TokenTrajectory(renderer, self.profile)
        return LiveRollout(self, trajectory, trajectory.clock)

    @functools.cached_property
    def end_of_turn_ids(self) -> frozenset[int]:
        """Stop ids that end a turn (``verl_ext.core.turn_end.end_of_turn_ids``): not message content."""
        return end_of_turn_ids(self.profile)

    @functools.cached_property
    def call_reader(self) -> CallReader | None:
        """The tool-call reader derived from the template (None where its form cannot be learned): it reads a
        turn where verl's parser reads no call (``parse_turn``), in every loop and the gateway."""
        return learn_call_reader(self.renderer, self.profile).reader

    def output_problems(self, ids: Sequence[int], logprobs: Sequence[float] | None) -> tuple[OutputProblem, ...]:
        """What is invalid in one engine output (the same test the trajectory and the check apply)."""
        return validate_engine_output(ids, logprobs, self.renderer.vocab_size, stop_ids=self.profile.stop_id_set)

    def engine_call(
        self,
        calls: EngineCalls,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        logprobs: Sequence[float] | None,
        max_tokens: int,
        stop_ids: Sequence[int],
        images: Sequence[Any] | None = None,
    ) -> tuple[EngineCall, FinishReason]:
        """The record of one engine call and how it ended, judged from its ids (not the engine's label), built by
        the rollout's log ``calls`` (what its prompt adds to the previous call's; ``images``: the images the call was
        given, kept as digests, None: not recorded) and not yet appended to it: the caller appends it once the turn
        is kept."""
        finish = judge_finish(output_ids, max_tokens, stop_ids, self.profile)
        return calls.next_call(prompt_ids, output_ids, logprobs, finish, images), finish

    async def turn(
        self,
        calls: EngineCalls,
        prompt_ids: Sequence[int],
        max_tokens: int,
        stop_ids: Sequence[int],
        generate: Callable[[int], Awaitable[G]],
        read: Callable[[Sequence[int]], Awaitable[ParsedTurn]],
    ) -> Turn[G]:
        """One turn: ``generate(max_tokens)`` (the caller's engine), the engine call (built by the rollout's log
        ``calls``, with the images the engine hook says it sent: its output's ``images``) and its finish, the
        output's problems, and ``read(ids)`` (the caller's tool-call reader) unless the output is invalid. The caller
        keeps the turn and appends its call to ``calls`` (``Turn.keep``, or its own log that calls
        ``keep_sampled``)."""
        out = await generate(max_tokens)
        images = getattr(out, "images", None)  # what the hook passed the engine (None: a text loop, not recorded)
        call, finish = self.engine_call(calls, prompt_ids, out.token_ids, out.log_probs, max_tokens, stop_ids, images)
        problems = self.output_problems(call.output_ids, call.logprobs)
        parsed = None if problems else await read(call.output_ids)
        return Turn(call, finish, out, problems, parsed)

    # -- the end of a rollout --------------------------------------------------------------------------
    def conclude(self, rollout: Rollout, counters: Counter[str]) -> CheckResult:
        """The end of a rollout: ``judge`` it (check unless the check is off, write its record), report its metrics
        to the sink, apply the policy. Raises ``ConsistencyError`` only where the policy says so (strict mode)."""
        result = self.judge(rollout, counters)
        if self.sink is not None:
            self.sink(result, counters)
        self.enforcer.enforce(result, rollout.step)
        return result

    def judge(self, rollout: Rollout, counters: Counter[str]) -> CheckResult:
        """Check the rollout (unless the policy's mode is off: then an empty verdict) and write its record; a record
        that cannot be written is counted in ``counters`` (``WRITE_FAILURES``), never raised."""
        if self.checker.policy.mode is CheckMode.OFF:
            result = checked_off(rollout)
        else:
            result = self.checker.check_rollout(rollout)
        self.write_record(rollout, result, counters)
        return result

    def write_record(self, rollout: Rollout, result: CheckResult, counters: Counter[str]) -> bool:
        """Records are diagnostics: a record that cannot be built or written (the folder cannot be created on this
        node, the disk is full, ...) is counted in ``records/write_failures`` and training goes on. Each new cause is
        logged at ERROR once per process; repeats of it only count (a read-only folder fails every rollout). False
        when the record was not written (no writer, or it failed). A written record's images then get their
        thumbnails (``write_thumbnails``)."""
        if self.writer is None:
            return False
        try:
            self.writer.write(rollout.record(result))
        except (OSError, TypeError, ValueError) as exc:
            cause = f"{type(exc).__name__}: {exc}"
            self._count_failure(
                counters,
                WRITE_FAILURES,
                cause,
                "verl_ext: could not write a rollout record to %s (%s); training goes on, each failure is "
                "counted in tito/records/write_failures. Fix: make verl_ext.records.dir a folder every node "
                "can create and write, or set it to null",
                self.writer.path,
                cause,
            )
            return False
        self.write_thumbnails(rollout, counters)
        return True

    def write_thumbnails(self, rollout: Rollout, counters: Counter[str]) -> None:
        """The thumbnails of the rollout's images (after its record: a thumbnail never costs a record). One that
        cannot be written is counted in ``records/thumbnail_failures`` and each new cause logged at ERROR once per
        process; the report says the thumbnail is missing."""
        if self.thumbnails is None or not rollout.pixels:
            return
        try:
            self.thumbnails.write(rollout.pixels)
        except Exception as exc:  # Pillow raises anything from OSError to DecompressionBombError: never a rollout's
            self._count_failure(
                counters,
                THUMBNAIL_FAILURES,
                "thumbnail " + _failure_kind(exc),  # logged once per kind, not once per image (names differ)
                "verl_ext: could not write an image thumbnail to %s (%s); the record was written, the report "
                "shows the thumbnail as missing, each failure is counted in tito/records/thumbnail_failures. "
                "Fix: make the folder writable, or set verl_ext.records.thumbnails=false",
                self.thumbnails.folder,
                f"{type(exc).__name__}: {exc}",
            )

    def _count_failure(self, counters: Counter[str], counter: str, kind: str, message: str, *args: Any) -> None:
        """Count a failure in ``counter``; log ``message`` at ERROR the first time this process meets its ``kind``
        (a read-only folder fails every rollout: repeats only count)."""
        counters[counter] += 1
        if kind not in self.record_failures_logged:
            self.record_failures_logged.add(kind)
            log.error(message, *args)


def _failure_kind(exc: Exception) -> str:
    """A failure's kind without what differs per image (paths and digests): an OSError's type and reason, any
    other error's type and message with its digests and quoted names blanked."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: {exc.strerror}"
    return f"{type(exc).__name__}: " + re.sub(r"[0-9a-f]{16}|'[^']*'", "…", str(exc))


def checked_off(rollout: Rollout) -> CheckResult:
    """The verdict on a rollout the check does not run on (``check.mode=off``): no finding, no failure, its counts."""
    return CheckResult((), (), False, False, 0, len(rollout.calls), rollout.num_sampled, Counter(rollout.repairs))
