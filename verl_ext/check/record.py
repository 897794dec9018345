"""The rollout record: one typed, versioned object per rollout, from the agent loop to the report.

The flow of one rollout's data (every arrow hands over a frozen dataclass, never loose parameters or raw dicts)::

    agent loop (plugin/agent_loop.py, plugin/audit_loop.py; tests and bench build it the same way)
      │  Rollout.of(calls, sample, messages, tools, step=..., prompt_messages=..., response_length=..., ...)
      ▼
    Rollout ── engine calls, trainer sample, messages, tools, prompt/response lengths, step, the trajectory's
      │        token kinds and repair log; computed once: ``assistants`` (assistant message of each engine
      │        call) and ``turn_of`` (the engine call each stream token belongs to)
      ├──▶ ConsistencyChecker.check_rollout(rollout) ──▶ CheckResult ──▶ tito/ metrics (telemetry/metrics.py)
      ▼
    rollout.record(result) ──▶ RolloutRecord ── what one line of a record file holds, typed
      │  RecordWriter.write (telemetry/records.py): ``to_json()``, ``"version": SCHEMA_VERSION`` in every line
      ▼
    record file (JSONL: a ``RecordHeader`` line with the template profile, then one rollout per line)
      │  read_records (telemetry/records.py) -> RecordHeader.from_json / RolloutRecord.from_json(obj, "file:line"):
      │  every field type-checked, one-line RecordError naming file, line, key and fix
      ├──▶ verl-ext report (report/load.py ... report/tokens.py read RolloutRecord attributes, ``turn_of`` included)
      └──▶ verl-ext replay: ``RolloutRecord.replay_record()`` is a ``core.replay.ReplayRecord``, the same type
           the replay format parses to (a record line is the replay format plus the stream, calls and check)

The record holds the check's result as ``RecordedCheck`` (causes and failure kinds as strings, spans as pairs), not
as ``CheckResult``: a record written by a newer verl_ext, with a cause this version does not know, still loads and
is reported under its own name. ``ConsistencyChecker.check(calls, sample, messages, ...)`` remains for callers that
hold the parts (tests, benchmarks): it builds the ``Rollout`` and calls ``check_rollout``.

Schema versions (``"version"`` in every line; ``docs/check.md`` lists the keys):

- no version: files written before the version was recorded. Same keys as version 1; they load as version 1
  (keys they lack take their defaults: ``turn_of`` is recomputed from ``engine_calls``).
- 1: JSON floats could be bare ``NaN``/``Infinity`` (not JSON; Python's reader accepts them, others do not).
- 2: a float that is not finite is written as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``
  (valid JSON). Float fields (logprobs) read those strings back as floats, so a record round-trips exactly; a
  non-finite float anywhere else (a tool argument in a message) stays that string.
- 3: ``response_length``, the trainer's cap on the response, so replay cuts its stream where the trainer
  cut it (a turn that filled the budget gets a synthetic close past the cap, which is not trained). Lines of
  versions 1 and 2 lack it and still load (replay then infers the cut, ``check.replay_diff``).
- 4: the images each engine call was given, as digests (``engine_calls[k].images``: ``{"kept": n,
  "added": [...]}``, the first ``n`` images of the call before it then these; only on calls whose loop recorded
  them), and the check's ``image_calls_unchecked``. Lines of versions 1 to 3 lack them and still load; the image
  view then says it had no per-call evidence.
- 5: ``rollout_id``, a stable id of the rollout, which verl's batch carries too (the loops' ``extra_fields``
  ``verl_ext_rollout_id``): what arrives later about the rollout (the trainer's numbers) joins by it, as its own
  line, so records stay append-only. Lines of versions 1 to 4 lack it and load with ``rollout_id`` None.
- 6: ``"type": "numerics"`` lines (``check/numerics_record.py``): the trainer's numbers of a rollout, per
  turn and depth, joined to its rollout line by ``rollout_id``. Rollout lines are unchanged; files of versions 1 to
  5 have no numerics lines, and the report says the view is absent and why.
- 7 (current): ``versions`` (``core/version_spans.py``): each engine call's attempts (an abort and its resumes), a
  row ``[version, start, end, version_at_stop, ids_cut, prompt_crc, ids_crc, logprobs_crc]`` each (the first three
  its version span), and ``trained_step``. ``step`` stays what it was: the step the loop was given (verl's
  ``global_steps``; the served version + 1 where it was given none). Lines of versions 1 to 6 lack ``versions`` and
  load with it None (the version view then has nothing to compare).
- A version above ``SCHEMA_VERSION`` is refused with a message to upgrade verl_ext.

The header line's types are in ``check/record_header.py``; the typed JSON reads both use, in ``check/record_json.py``.

The check layer holds this type (not the plugin): it depends on the token core only, no verl, Ray or torch.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from enum import Enum
from functools import cached_property
from typing import Any

from verl_ext.check.engine_view import turn_at
from verl_ext.check.findings import CheckResult, Finding, Span
from verl_ext.check.inputs import EngineCall, TrainerSample, engine_call_images, rollout_assistants
from verl_ext.check.record_json import JsonFields, json_objects, read_version
from verl_ext.core.engine_output import NAN_HAPPENED
from verl_ext.core.errors import TrajectoryError
from verl_ext.core.messages import json_type
from verl_ext.core.replay import (
    SCHEMA_VERSION,
    RecordError,
    ReplayRecord,
    Unparsed,
    parse_finish,
)
from verl_ext.core.version_spans import RolloutVersions

_REPLAYABLE_FINISH = ("stop", "length", NAN_HAPPENED)  # what the replay format's "finish" accepts as a string


@dataclass(frozen=True)
class Rollout:
    """One finished rollout as the loop hands it to the check, the metrics and the record writer.

    Build it with ``Rollout.of``. ``kinds`` (one per trainer-stream token: "prompt", "sampled", "boundary", ...)
    and ``repair_log`` come from the loop's trajectory; without them the record derives kinds from the engine
    calls alone. ``repairs`` counts the trajectory's edits by kind (empty when unknown).
    """

    calls: tuple[EngineCall, ...]
    sample: TrainerSample
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] | None = None
    prompt_messages: int | None = None  # messages in the first prompt (assistant messages in it are history)
    response_length: int | None = None  # the trainer's cap on the response (truncation is judged against it)
    step: int = 0
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    kinds: tuple[str, ...] | None = None
    repairs: Mapping[str, int] = field(default_factory=dict)
    repair_log: tuple[Mapping[str, Any], ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)  # more keys for the record (data_source, index, ...)
    # The time the template's strftime_now read in this rollout (``TokenTrajectory.clock``); None: it reads none.
    template_clock: str | None = None
    # Each image of the rollout by its digest (the loop's PIL images or bytes), for the thumbnails written beside
    # the record; never in the record itself (it holds digests).
    pixels: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # A stable id of this rollout (``Rollout.of`` draws one): in its record line and in verl's batch (``batch_fields``)
    rollout_id: str = ""
    # Each engine call's attempts with their policy versions, and the step that trains the rollout (None: a loop
    # that records no versions)
    versions: RolloutVersions | None = None

    @classmethod
    def of(
        cls,
        calls: Sequence[EngineCall],
        sample: TrainerSample,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        prompt_messages: int | None = None,
        response_length: int | None = None,
        step: int = 0,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        kinds: Sequence[str] | None = None,
        repairs: Mapping[str, int] | None = None,
        repair_log: Sequence[Mapping[str, Any]] = (),
        extra: Mapping[str, Any] | None = None,
        template_clock: str | None = None,
        pixels: Mapping[str, Any] | None = None,
        rollout_id: str | None = None,
        versions: RolloutVersions | None = None,
    ) -> Rollout:
        """Raises TrajectoryError when ``kinds`` is shorter than the trainer's stream (one kind per token is
        needed), and for an ``extra`` key that is not one of ``EXTRA_KEYS`` (the reader refuses unknown keys)."""
        unknown = sorted(set(extra or {}) - EXTRA_KEYS)
        if unknown:
            raise TrajectoryError(
                f"Rollout: extra keys {unknown} are not record keys; the record's extras are {sorted(EXTRA_KEYS)} "
                "(add a new one to EXTRA_KEYS, which the reader checks)"
            )
        if kinds is not None and len(kinds) < len(sample.stream):
            raise TrajectoryError(
                f"Rollout: {len(kinds)} kinds for a stream of {len(sample.stream)} tokens; pass one per token"
            )
        return cls(
            tuple(calls),
            sample,
            tuple(messages),
            tuple(tools) if tools else None,
            prompt_messages,
            response_length,
            int(step),
            dict(chat_template_kwargs or {}),
            None if kinds is None else tuple(map(str, kinds[: len(sample.stream)])),
            dict(repairs or {}),
            tuple(repair_log),
            dict(extra or {}),
            template_clock,
            dict(pixels or {}),
            rollout_id or uuid.uuid4().hex,
            versions,
        )

    def batch_fields(self, result: CheckResult) -> dict[str, Any]:
        """What verl's batch carries of this rollout per sample (the agent loop's ``extra_fields``, which verl keeps
        as ``non_tensor_batch`` columns): the check's compact verdict and the rollout's id, the key its record line
        and anything recorded about it later share; and ``verl_ext_turn_starts``, where each engine call's sampled
        tokens start in the response (response-relative: position minus the prompt's length), so the trainer's
        numbers can be split by turn where only the batch is at hand."""
        return {
            "verl_ext_check": result.verdict_fields(),
            "verl_ext_rollout_id": self.rollout_id,
            "verl_ext_turn_starts": self.turn_starts,
        }

    @property
    def turn_starts(self) -> list[int]:
        """Each engine call's first sampled token, as a position in the trainer's response (``batch_fields``)."""
        p = len(self.sample.prompt_ids)
        return [c.output_start - p for c in self.calls]

    @cached_property
    def assistants(self) -> tuple[int, ...]:
        """Index of the assistant message each engine call produced (``assistants[k]`` answers call k); shorter
        than ``calls`` when the rollout ended before a call's message was appended."""
        return tuple(rollout_assistants(self.messages, len(self.calls), self.prompt_messages))

    @cached_property
    def turn_of(self) -> tuple[int, ...]:
        """The engine call (assistant turn) each trainer-stream token belongs to (``turn_at``)."""
        return turns_of(self.calls, len(self.sample.stream))

    @cached_property
    def token_kinds(self) -> tuple[str, ...]:
        """``kinds`` when the loop gave them; otherwise what the engine record alone tells: prompt, sampled or
        context."""
        if self.kinds is not None:
            return self.kinds
        p = len(self.sample.prompt_ids)
        sampled = {i for c in self.calls for i in range(c.output_start, c.output_end)}
        n = len(self.sample.stream)
        return tuple("prompt" if i < p else "sampled" if i in sampled else "context" for i in range(n))

    @property
    def num_sampled(self) -> int:
        return sum(len(c.output_ids) for c in self.calls)

    def record(self, result: CheckResult) -> RolloutRecord:
        """The record file's line for this rollout, with the check's result."""
        by_message = list(zip(self.assistants, self.calls, strict=False))
        p = len(self.sample.prompt_ids)
        first_assistant = self.assistants[0] if self.assistants else None
        logprobs = self.sample.response_logprobs
        return RolloutRecord(
            version=SCHEMA_VERSION,
            step=self.step,
            messages=tuple(dict(m) for m in self.messages),
            tools=tuple(dict(t) for t in self.tools) if self.tools else None,
            chat_template_kwargs=dict(self.chat_template_kwargs),
            prompt_messages=self.prompt_messages if self.prompt_messages is not None else first_assistant,
            sampled={i: c.output_ids for i, c in by_message},
            logprobs={i: c.logprobs for i, c in by_message if c.logprobs is not None},
            finish={i: c.finish_reason for i, c in by_message if c.finish_reason in _REPLAYABLE_FINISH},
            prompt_length=p,
            input_ids=self.sample.stream,
            loss_mask=(0,) * p + self.sample.response_mask,
            trainer_logprobs=None if logprobs is None else (0.0,) * p + logprobs,
            kinds=self.token_kinds,
            turn_of=self.turn_of,
            repairs=tuple(dict(r) for r in self.repair_log),
            engine_calls=recorded_calls(self.calls),
            check=RecordedCheck.of(result),
            extra=dict(self.extra),
            template_clock=self.template_clock,
            response_length=self.response_length,
            rollout_id=self.rollout_id or None,
            versions=self.versions,
        )


def turns_of(calls: Sequence[EngineCall] | Sequence[RecordedCall], n: int) -> tuple[int, ...]:
    """``turn_at`` (the engine call a stream position belongs to: the last call whose output starts at or before
    it; the first call's prompt belongs to call 0) for positions 0..n-1, in one pass."""
    starts = [c.output_start for c in calls]
    if starts != sorted(starts):  # only a broken engine record: take turn_at's answer position by position
        return tuple(turn_at(calls, p) for p in range(n))  # type: ignore[arg-type]
    if not calls:
        return (0,) * n
    # call k holds positions from its output start (0 for call 0) to the next call's: one repetition per call, not a
    # step per position (200k positions at the end of a 1,000-turn rollout)
    out: list[int] = []
    for k in range(len(calls)):
        lo = 0 if k == 0 else min(starts[k], n)
        hi = min(starts[k + 1], n) if k + 1 < len(calls) else n
        out += [k] * max(0, hi - lo)
    return tuple(out)


# -- what a record file holds, typed ------------------------------------------------------------------------
# The check's result as the file holds it: causes and failure kinds are strings, so a record written by a newer
# verl_ext (a cause this version does not know) still loads and is reported under its name.


@dataclass(frozen=True)
class RecordedImages:
    """The images one engine call was given, as the record holds them: the first ``kept`` images of the call before
    it in the record, then the images whose digests are ``added`` (a rollout whose calls repeat the images so far
    plus new ones holds each digest once)."""

    kept: int
    added: tuple[str, ...]


@dataclass(frozen=True)
class RecordedCall:
    """One engine call as the record holds it: its prompt is the stream's first ``prompt_length`` tokens; ``images``
    the images it was given (None: not recorded, as in records before schema version 4 and text loops)."""

    prompt_length: int
    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    finish_reason: str
    images: RecordedImages | None = None

    @classmethod
    def of(cls, call: EngineCall, images: RecordedImages | None = None) -> RecordedCall:
        return cls(call.prompt_length, call.output_ids, call.logprobs, call.finish_reason, images)

    @property
    def output_start(self) -> int:
        return self.prompt_length

    def to_json(self) -> dict[str, Any]:
        """One of a record line's ``engine_calls``: one key per field, in field order (``images`` only where
        recorded: a text rollout's lines are as before)."""
        out = _json_fields(self)
        if self.images is None:
            del out["images"]
        else:
            out["images"] = {"kept": self.images.kept, "added": list(self.images.added)}
        return out


def recorded_calls(calls: Sequence[EngineCall]) -> tuple[RecordedCall, ...]:
    """``calls`` as the record holds them: each call's images relative to the call before it in ``calls``."""
    out: list[RecordedCall] = []
    before: tuple[str, ...] | None = None
    for call, (_, digests) in zip(calls, engine_call_images(calls), strict=True):
        images = None
        if digests is not None:
            kept = 0
            if before is not None:
                n = min(len(before), len(digests))
                while kept < n and before[kept] == digests[kept]:
                    kept += 1
            images = RecordedImages(kept, digests[kept:])
        out.append(RecordedCall.of(call, images))
        before = digests
    return tuple(out)


def recorded_call_images(calls: Sequence[RecordedCall]) -> list[tuple[int, tuple[str, ...] | None]]:
    """Per recorded call, its prompt length and the digests of the images it was given (None: not recorded), as
    ``engine_call_images`` reads live calls (the image view's input)."""
    out: list[tuple[int, tuple[str, ...] | None]] = []
    before: tuple[str, ...] | None = None
    for call in calls:
        digests = None
        if call.images is not None:
            digests = (before or ())[: call.images.kept] + call.images.added
        out.append((call.prompt_length, digests))
        before = digests
    return out


_CALL_KEYS = frozenset(f.name for f in fields(RecordedCall))


@dataclass(frozen=True)
class RecordedFailure:
    """An engine-view failure (``EngineFailure``, field for field); ``position`` None: a failure of the whole
    rollout."""

    kind: str
    turn: int | None
    position: int | None
    detail: str


@dataclass(frozen=True)
class RecordedFinding:
    """A finding (``Finding``, field for field): spans are (start, end) stream / template positions."""

    cause: str
    allowed: bool
    turn: int
    boundary: str
    region: str
    stream: tuple[int, int]
    rendered: tuple[int, int]
    stream_ids: tuple[int, ...]
    rendered_ids: tuple[int, ...]
    stream_text: str
    rendered_text: str
    context_before: str
    context_after: str
    detail: str = ""

    @classmethod
    def of(cls, finding: Finding) -> RecordedFinding:
        """``finding`` as the record holds it."""
        return cls(**_recorded_fields(finding))


@dataclass(frozen=True)
class RecordedCheck:
    """The check's verdict on one rollout: ``CheckResult``'s fields and its ``ok`` and ``engine_ok``, field for field
    (``of``), and, through ``to_json``, the ``check`` object of a record line and ``CheckResult.to_dict``. The JSON
    keys are these fields, in this order."""

    ok: bool
    engine_ok: bool
    engine_failures: tuple[RecordedFailure, ...]
    findings: tuple[RecordedFinding, ...]
    template_view: bool
    truncated: bool
    lost_sampled_tokens: int
    num_turns: int
    num_sampled: int
    repairs: Mapping[str, int]
    seconds: float
    template_view_skipped: str = ""
    image_calls_unchecked: str = ""

    @classmethod
    def of(cls, result: CheckResult) -> RecordedCheck:
        """``result`` as the record holds it. Every field of the result (and of its failures and findings) is
        passed on by name, so a field added to ``CheckResult``, ``EngineFailure`` or ``Finding`` and not here fails
        every record as an unexpected argument instead of being dropped from the files."""
        recorded = _recorded_fields(result, "ok", "engine_ok")
        recorded["engine_failures"] = tuple(RecordedFailure(**_recorded_fields(f)) for f in result.engine_failures)
        recorded["findings"] = tuple(RecordedFinding(**_recorded_fields(f)) for f in result.findings)
        recorded["seconds"] = float(round(result.seconds, 6))  # the record's precision: a microsecond
        return cls(**recorded)

    @property
    def defects(self) -> int:
        return sum(not f.allowed for f in self.findings)

    @classmethod
    def from_json(cls, obj: Any, where: str) -> RecordedCheck:
        """The ``check`` object of a record line, every key type-checked; an unknown key is refused."""
        f = JsonFields(obj, where, "check")
        f.only({x.name for x in fields(cls)}, "the check's result")
        findings = tuple(
            RecordedFinding(
                cause=g.str("cause", default="unknown"),
                allowed=g.bool("allowed", default=False),
                turn=g.int("turn", default=0),
                boundary=g.str("boundary", default=""),
                region=g.str("region", default=""),
                stream=g.span("stream"),
                rendered=g.span("rendered"),
                stream_ids=g.ints("stream_ids", default=()),
                rendered_ids=g.ints("rendered_ids", default=()),
                stream_text=g.str("stream_text", default=""),
                rendered_text=g.str("rendered_text", default=""),
                context_before=g.str("context_before", default=""),
                context_after=g.str("context_after", default=""),
                detail=g.str("detail", default=""),
            )
            for g in json_objects(f, "findings", RecordedFinding)
        )
        failures = tuple(
            RecordedFailure(
                kind=g.str("kind", default="unknown"),
                turn=g.int("turn", default=None),
                position=g.int("position", default=None),
                detail=g.str("detail", default=""),
            )
            for g in json_objects(f, "engine_failures", RecordedFailure)
        )
        return cls(
            ok=f.bool("ok", default=False),
            engine_ok=f.bool("engine_ok", default=True),
            engine_failures=failures,
            findings=findings,
            template_view=f.bool("template_view", default=False),
            truncated=f.bool("truncated", default=False),
            lost_sampled_tokens=f.int("lost_sampled_tokens", default=0) or 0,
            num_turns=f.int("num_turns", default=0) or 0,
            num_sampled=f.int("num_sampled", default=0) or 0,
            repairs={str(k): f.count(f"repairs.{k}", v) for k, v in f.dict("repairs", default={}).items()},
            seconds=f.float("seconds", default=0.0),
            template_view_skipped=f.str("template_view_skipped", default=""),
            image_calls_unchecked=f.str("image_calls_unchecked", default=""),
        )

    def to_json(self) -> dict[str, Any]:
        """The ``check`` object of a record line: one key per field, in field order."""
        return _json_fields(self)


def _recorded_fields(obj: Any, *properties: str) -> dict[str, Any]:
    """The named ``properties`` and every dataclass field of a check-result object, by name, as the record holds
    them: an enum as its string, a ``Span`` as (start, end), a ``Counter`` as a dict (nested objects as they are)."""
    out: dict[str, Any] = {}
    for name in (*properties, *(f.name for f in fields(obj))):
        value = getattr(obj, name)
        if isinstance(value, Enum):
            value = value.value
        elif isinstance(value, Span):
            value = (value.start, value.end)
        elif isinstance(value, Counter):
            value = dict(value)
        out[name] = value
    return out


def _json_fields(obj: Any) -> dict[str, Any]:
    """A record dataclass as JSON-ready data: one key per field, in field order; a tuple of dataclasses as a list
    of objects, any other tuple as a list, a mapping as a dict."""
    out: dict[str, Any] = {}
    for f in fields(obj):
        value = getattr(obj, f.name)
        if isinstance(value, tuple):
            # the fields are typed tuple[X, ...], so the first item says what every item is
            value = [_json_fields(v) for v in value] if value and is_dataclass(value[0]) else list(value)
        elif isinstance(value, Mapping):
            value = dict(value)
        out[f.name] = value
    return out


# The keys a loop may add to a rollout line (``Rollout.extra``): the dataset row's source and index, the turns a
# resumed rollout replayed, the gateway's session and branch (``gateway``), and the loop's name (``loop``: the
# report's fix texts are that loop's, verl_ext.report.loops). The reader refuses any key that is neither one of these
# nor a record key.
EXTRA_KEYS = frozenset({"data_source", "index", "resumed_turns", "gateway", "images", "loop"})  # images: image_view

# The record's own keys; the others a rollout line may hold are ``EXTRA_KEYS``.
_KEYS = frozenset(
    {
        "type",
        "version",
        "rollout_id",
        "step",
        "messages",
        "tools",
        "chat_template_kwargs",
        "prompt_messages",
        "sampled",
        "logprobs",
        "finish",
        "prompt_length",
        "response_length",
        "input_ids",
        "loss_mask",
        "trainer_logprobs",
        "kinds",
        "turn_of",
        "repairs",
        "engine_calls",
        "check",
        "template_clock",
        "versions",
    }
)


@dataclass(frozen=True)
class RolloutRecord:
    """One rollout line of a record file. ``sampled``, ``logprobs`` and ``finish`` map an assistant message index to
    its engine call's output (the replay format); the stream fields (``input_ids``, ``loss_mask``, ``kinds``,
    ``turn_of``, ``trainer_logprobs``) have one entry per trainer-stream token."""

    version: int
    step: int
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] | None
    chat_template_kwargs: Mapping[str, Any]
    prompt_messages: int | None
    sampled: Mapping[int, tuple[int, ...]]
    logprobs: Mapping[int, tuple[float, ...]]
    finish: Mapping[int, Any]  # "stop", "length", SGLang's "NaN happened" (or its finish_reason object)
    prompt_length: int
    input_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    trainer_logprobs: tuple[float, ...] | None
    kinds: tuple[str, ...]
    turn_of: tuple[int, ...]
    repairs: tuple[dict[str, Any], ...]  # the trajectory's edit log
    engine_calls: tuple[RecordedCall, ...]
    check: RecordedCheck
    extra: Mapping[str, Any] = field(default_factory=dict)
    template_clock: str | None = None  # absent from records written before it existed, and where none was read
    # The trainer's cap on the response (the stream holds at most prompt_length + response_length tokens); None in
    # records from before version 3, and where the loop had no cap.
    response_length: int | None = None
    rollout_id: str | None = None  # the rollout's stable id; None in records from before version 5
    versions: RolloutVersions | None = None  # None in records from before version 7 and from loops without them

    @property
    def sampled_logprobs(self) -> dict[int, float]:
        """Stream position -> the engine's logprob, over every engine call's output."""
        out: dict[int, float] = {}
        for call in self.engine_calls:
            for i, lp in enumerate(call.logprobs or ()):
                out[call.prompt_length + i] = lp
        return out

    def to_json(self) -> dict[str, Any]:
        """The JSON object of the record line, in its key order; floats that are not finite are still floats here
        (``RecordWriter`` writes them as strings, see the module docstring)."""
        return {
            "type": "rollout",
            "version": self.version,
            **({"rollout_id": self.rollout_id} if self.rollout_id is not None else {}),
            "step": self.step,
            **self._replay_json(),
            "prompt_length": self.prompt_length,
            "response_length": self.response_length,
            "input_ids": list(self.input_ids),
            "loss_mask": list(self.loss_mask),
            "trainer_logprobs": None if self.trainer_logprobs is None else list(self.trainer_logprobs),
            "kinds": list(self.kinds),
            "turn_of": list(self.turn_of),
            "repairs": [dict(r) for r in self.repairs],
            "engine_calls": [c.to_json() for c in self.engine_calls],
            "check": self.check.to_json(),
            **({"versions": self.versions.to_json()} if self.versions is not None else {}),
            **dict(self.extra),
        }

    def _replay_json(self) -> dict[str, Any]:
        """The replay-format keys of the record line (a record line is the replay format plus the stream)."""
        out = {
            "messages": [dict(m) for m in self.messages],
            "tools": [dict(t) for t in self.tools] if self.tools else None,
            "chat_template_kwargs": dict(self.chat_template_kwargs),
            "prompt_messages": self.prompt_messages,
            "sampled": {str(i): list(v) for i, v in self.sampled.items()},
            "logprobs": {str(i): list(v) for i, v in self.logprobs.items()},
            "finish": {str(i): v for i, v in self.finish.items()},
        }
        if self.template_clock is not None:  # only where the template read the clock: other lines stay as they were
            out["template_clock"] = self.template_clock
        return out

    def replay_record(self, where: str = "record") -> ReplayRecord:
        """The conversation as ``verl-ext replay`` rebuilds it. Raises RecordError (naming ``where``) when the
        record cannot be replayed (e.g. logprob counts that disagree with the ids: an engine failure). A rollout
        that ended on an engine call whose output never became a message (invalid output, kept up to its first
        problem) has one engine call more than ``sampled`` has messages: that call is replayed from
        ``engine_calls``."""
        unparsed = None
        if len(self.engine_calls) == len(self.sampled) + 1:
            last = self.engine_calls[-1]
            finish = last.finish_reason if last.finish_reason in _REPLAYABLE_FINISH else "stop"
            unparsed = Unparsed(last.output_ids, last.logprobs, parse_finish(finish))
        return ReplayRecord.from_json(self._replay_json(), where, unparsed)

    # long: one type check per field, in the order the format documents them; split, the format would scatter
    @classmethod
    def from_json(cls, obj: Any, where: str = "record") -> RolloutRecord:
        """A record line, every field type-checked. Raises RecordError with one line naming ``where`` (file:line),
        the key and the fix. Keys a version-less (pre-version-1) record lacks take their defaults."""
        f = JsonFields(obj, where, "")
        version = read_version(f, where)
        f.only(_KEYS | EXTRA_KEYS, "a rollout record")
        input_ids = f.ints("input_ids", default=())
        n = len(input_ids)
        calls = []
        for k, item in enumerate(f.list("engine_calls", default=[])):
            g = JsonFields(item, where, f"engine_calls[{k}]")
            g.only(_CALL_KEYS, "an engine call")
            calls.append(
                RecordedCall(
                    prompt_length=g.int("prompt_length", default=0) or 0,
                    output_ids=g.ints("output_ids", default=()),
                    logprobs=g.floats("logprobs", default=None),
                    finish_reason=g.str("finish_reason", default="stop"),
                    images=_recorded_images(g, where, k, calls[-1].images if calls else None),
                )
            )
        if "check" not in obj or not isinstance(obj["check"], dict):
            raise RecordError(
                f"{where}: the rollout record has no 'check' object ({json_type(obj.get('check'))}); "
                "was it written by the check? Records come from verl_ext.records.dir"
            )
        messages = f.list("messages", default=[])
        for k, m in enumerate(messages):
            if not isinstance(m, dict):
                raise f.error(f"messages[{k}]", "an object (an OpenAI-format message)", m)
        tools = f.list("tools", default=None)
        for k, t in enumerate(tools or []):
            if not isinstance(t, dict):
                raise f.error(f"tools[{k}]", "an object (a tool schema)", t)
        kinds = tuple(f.strs("kinds", default=()))[:n]
        repairs = f.list("repairs", default=[])
        for k, edit in enumerate(repairs):
            if not isinstance(edit, dict):
                raise f.error(f"repairs[{k}]", "an object (one edit of the trajectory's repair log)", edit)
        finish = f.dict("finish", default={})
        for k in finish:
            if not (k.isascii() and k.isdigit()):
                raise RecordError(f"{where}: 'finish' key {k!r} is not a message index (write \"1\")")
        turn_of = f.ints("turn_of", default=None)
        if turn_of is None:  # a record from before turn_of was written
            turn_of = turns_of(calls, n)
        return cls(
            version=version,
            step=f.int("step", default=0) or 0,
            messages=tuple(messages),
            tools=tuple(tools) if tools else None,
            chat_template_kwargs=f.dict("chat_template_kwargs", default={}),
            prompt_messages=f.int("prompt_messages", default=None),
            sampled=f.by_index("sampled", "ints"),
            logprobs=f.by_index("logprobs", "floats"),
            finish={int(k): v for k, v in finish.items()},
            prompt_length=f.int("prompt_length", default=calls[0].prompt_length if calls else 0) or 0,
            input_ids=input_ids,
            loss_mask=f.ints("loss_mask", default=()),
            trainer_logprobs=f.floats("trainer_logprobs", default=None),
            kinds=kinds + ("?",) * (n - len(kinds)),
            turn_of=turn_of,
            repairs=tuple(repairs),
            engine_calls=tuple(calls),
            check=RecordedCheck.from_json(obj["check"], where),
            extra={k: v for k, v in obj.items() if k not in _KEYS},
            template_clock=f.str("template_clock", default=None),
            response_length=f.int("response_length", default=None),
            rollout_id=f.str("rollout_id", default=None),
            versions=_recorded_versions(obj.get("versions"), where),
        )


def _recorded_versions(raw: Any, where: str) -> RolloutVersions | None:
    """The line's ``versions`` object (schema 7), type-checked; None where the line has none."""
    if raw is None:
        return None
    try:
        return RolloutVersions.from_json(raw)
    except (ValueError, TypeError) as exc:
        raise RecordError(f"{where}: {exc}; records are written by verl_ext.records.dir, do not edit them") from exc


def _recorded_images(g: JsonFields, where: str, k: int, before: RecordedImages | None) -> RecordedImages | None:
    """An engine call's ``images`` (``{"kept": n, "added": [digests]}``), type-checked; ``n`` at most the images of
    the call before it (``before``: its record; None: it has none)."""
    raw = g.dict("images", default=None)
    if raw is None:
        return None
    f = JsonFields(raw, where, f"engine_calls[{k}].images")
    f.only(("kept", "added"), "an engine call's images")
    kept = f.int("kept", default=0) or 0
    added = f.strs("added", default=())
    room = 0 if before is None else before.kept + len(before.added)
    if not 0 <= kept <= room:
        raise f.error("kept", f"an integer from 0 to {room} (the images of the engine call before it)", kept)
    return RecordedImages(kept, tuple(added))
