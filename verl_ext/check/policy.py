"""What to do with a check result: the policy (from config) and its enforcement."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from verl_ext.check.findings import ALLOWED_BY_DESIGN, Cause, CheckResult, FailureKind
from verl_ext.core.errors import OptionsError, VerlExtError

log = logging.getLogger("verl_ext.check")


class CheckMode(StrEnum):
    """What the policy does with a failure or a defect (``verl_ext.check.mode``)."""

    STRICT = "strict"  # raise ConsistencyError on an engine-view failure or a defect
    WARN = "warn"  # log once per cause per step
    OFF = "off"  # do not check


class ConsistencyError(VerlExtError, RuntimeError):
    """The trainer's tokens are not the engine's, or a divergence is a defect; ``result`` has the details."""

    def __init__(self, message: str, result: CheckResult) -> None:
        super().__init__(message)
        self.result = result


@dataclass(frozen=True)
class CheckPolicy:
    """The ``verl_ext.check`` options: each field is one option key with its default (defined here only).
    Raises ``OptionsError`` for a value out of range."""

    mode: CheckMode = CheckMode.WARN
    allowed_causes: frozenset[Cause] = ALLOWED_BY_DESIGN
    template_view_rate: float = 1.0  # fraction of rollouts that also get the (full-render) template view
    logprob_atol: float = 1e-5
    # Seconds the template view may take on one rollout; past them it stops and the rollout counts as
    # ``check_skipped`` with the reason. None: no limit.
    template_view_budget_s: float | None = 10.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.template_view_rate <= 1.0 or math.isnan(self.template_view_rate):
            raise OptionsError(f"template_view_rate must be in [0, 1], got {self.template_view_rate}")
        if not self.logprob_atol >= 0.0:
            raise OptionsError(f"logprob_atol must be >= 0, got {self.logprob_atol}")
        budget = self.template_view_budget_s
        if budget is not None and not (budget > 0.0 and math.isfinite(budget)):
            raise OptionsError(f"template_view_budget_s must be a positive number of seconds or null, got {budget}")

    def allows(self, cause: Cause) -> bool:
        """Whether a finding of ``cause`` is by design (not a defect)."""
        return cause in self.allowed_causes

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> CheckPolicy:
        """Build from config keys ``mode``, ``allowed_causes``, ``template_view_rate``, ``logprob_atol``,
        ``template_view_budget_s``. An unknown key or a bad value raises ``OptionsError`` (a ``ValueError``) naming it
        and what is accepted."""
        known = {f.name for f in fields(cls)}  # the option keys are the fields
        unknown = sorted(set(options) - known)
        if unknown:
            raise OptionsError(f"unknown check option(s) {unknown}; known: {sorted(known)}")
        kwargs: dict[str, Any] = {}
        if "mode" in options:
            kwargs["mode"] = _parse_enum(CheckMode, options["mode"], "mode")
        if "allowed_causes" in options:
            kwargs["allowed_causes"] = parse_causes(options["allowed_causes"])
        for key in ("template_view_rate", "logprob_atol", "template_view_budget_s"):
            if key == "template_view_budget_s" and options.get(key, 0) is None:
                kwargs[key] = None
            elif key in options:
                try:
                    kwargs[key] = float(options[key])
                except (TypeError, ValueError):
                    raise OptionsError(f"check option {key!r} must be a number, got {options[key]!r}") from None
        return cls(**kwargs)


def parse_causes(value: Any) -> frozenset[Cause]:
    """``"default"`` (the allowed-by-design set), a list of cause names, or a list starting with ``default``."""
    if value in ("default", None):
        return ALLOWED_BY_DESIGN
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise OptionsError(f"allowed_causes must be 'default' or a list of cause names, got {value!r}")
    out: set[Cause] = set()
    for name in value:
        if name == "default":
            out |= ALLOWED_BY_DESIGN
        else:
            out.add(_parse_enum(Cause, name, "allowed_causes"))
    return frozenset(out)


def _parse_enum(enum: type[StrEnum], value: Any, key: str) -> Any:
    try:
        return enum(value)
    except ValueError:
        raise OptionsError(f"{key}: {value!r} is not one of {[e.value for e in enum]}") from None


@dataclass
class Enforcer:
    """Applies a policy to results: strict raises; warn logs each cause once per step."""

    policy: CheckPolicy
    _warned: set[tuple[int, str]] = field(default_factory=set)
    _step: int | None = None

    def enforce(self, result: CheckResult, step: int = 0) -> None:
        """Off: nothing. Strict: raises ``ConsistencyError`` when ``result`` is not ok. Warn: logs each engine
        failure kind and defect cause once per ``step``. A skipped template view is logged, never raised."""
        if self.policy.mode is CheckMode.OFF:
            return
        if step != self._step:  # steps may interleave (async rollouts): forget only steps well behind
            self._step = step
            self._warned = {(s, k) for s, k in self._warned if s >= step - 2}
        if result.template_view_skipped:  # never raises, even in strict mode: nothing was found to be wrong
            self._warn_once(
                step,
                "skipped",
                f"template view skipped, {result.template_view_skipped} (further skips this step are counted in "
                "tito/check_skipped, not logged)",
            )
        if result.ok:
            return
        if self.policy.mode is CheckMode.STRICT:
            raise ConsistencyError(explain(result), result)
        for f in result.engine_failures:
            self._warn_once(step, f"engine:{f.kind.value}", f"ENGINE VIEW FAILED ({f.kind.value}): {f.detail}")
        for f in result.defects:
            where = f"turn {f.turn}" + (f", {f.boundary}" if f.boundary else "")
            self._warn_once(
                step,
                f"defect:{f.cause.value}",
                f"token-consistency defect {f.cause.value} at {where}, stream positions "
                f"{f.stream.start}..{f.stream.end}: {f.detail} (further {f.cause.value} findings this step are "
                "counted in tito/ metrics, not logged)",
            )

    def _warn_once(self, step: int, key: str, message: str) -> None:
        if (step, key) not in self._warned:
            self._warned.add((step, key))
            log.warning("step %d: %s", step, message)


def explain(result: CheckResult) -> str:
    """A message a user can act on: what failed, where, and what to do."""
    lines = [f"token-consistency check failed: {result.summary()}"]
    for f in result.engine_failures:
        lines.append(f"  engine view [{f.kind.value}] turn {f.turn}: {f.detail}")
    for f in result.defects[:10]:
        lines.append(
            f"  defect [{f.cause.value}] turn {f.turn} {f.boundary or f.region} stream {f.stream.start}..{f.stream.end}"
            f": {f.detail}; around: {f.context_before!r} [{f.stream_text!r} vs template {f.rendered_text!r}] "
            f"{f.context_after!r}"
        )
    if len(result.defects) > 10:
        lines.append(f"  ... and {len(result.defects) - 10} more defects")
    if any(f.kind is FailureKind.RECORD for f in result.engine_failures):
        lines.append("The engine's own record is inconsistent (e.g. fewer logprobs than output ids): check the engine.")
    if any(f.kind is not FailureKind.RECORD for f in result.engine_failures):
        lines.append(
            "An engine-view failure means the trainer trains on tokens or logprobs the engine did not produce: "
            "the rollout changed them after generation. Replay the record with `verl-ext replay` to see the turn."
        )
    else:
        lines.append(
            "Defects are divergences from the chat template that verl_ext does not allow by design. Fix the rollout, "
            "or, if the divergence is intended, add the cause to verl_ext.check.allowed_causes; "
            "set verl_ext.check.mode=warn to log instead of raising."
        )
    return "\n".join(lines)
