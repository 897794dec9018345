"""What to do with a check result: the policy (from config) and its enforcement."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from verl_ext.check.findings import ALLOWED_BY_DESIGN, Cause, CheckResult, FailureKind
from verl_ext.core.errors import OptionsError, VerlExtError
from verl_ext.core.option_rules import choice, reject_unknown

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
    """The ``verl_ext.check`` options: each field is one option key with its default (defined here only), and
    ``__post_init__`` is the one place each key's rule lives, whether the policy comes from config
    (``from_mapping``) or is built directly. A bad value raises a one-line ``OptionsError`` naming the full key
    (``verl_ext.check.<key>``) and what it accepts."""

    mode: CheckMode = CheckMode.WARN
    allowed_causes: frozenset[Cause] = ALLOWED_BY_DESIGN
    template_view_rate: float = 1.0  # fraction of rollouts that also get the (full-render) template view
    logprob_atol: float = 1e-5
    # Seconds the template view may take on one rollout; past them it stops and the rollout counts as
    # ``check_skipped`` with the reason. None: no limit.
    template_view_budget_s: float | None = 10.0

    def __post_init__(self) -> None:
        # Normalised in place (the dataclass is frozen, hence object.__setattr__): config gives strings and lists,
        # and the rest of the check compares against CheckMode and Cause members and floats.
        # YAML 1.1 and Hydra's override parser read an unquoted `mode: off` / `verl_ext.check.mode=off` as false.
        mode = CheckMode.OFF if self.mode is False else self.mode
        object.__setattr__(self, "mode", choice("verl_ext.check.mode", CheckMode, mode))
        object.__setattr__(self, "allowed_causes", parse_causes(self.allowed_causes))
        for key, rule in _NUMBERS.items():
            value = getattr(self, key)
            if value is not None or not rule.nullable:
                object.__setattr__(self, key, rule.check(f"verl_ext.check.{key}", value))

    def allows(self, cause: Cause) -> bool:
        """Whether a finding of ``cause`` is by design (not a defect)."""
        return cause in self.allowed_causes

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> CheckPolicy:
        """Build from the ``verl_ext.check`` config keys (this class's fields); an absent key takes its default. An
        unknown key or a bad value raises ``OptionsError`` (a ``ValueError``) naming it and what is accepted."""
        reject_unknown("verl_ext.check", options, {f.name for f in fields(cls)})  # the option keys are the fields
        return cls(**options)


@dataclass(frozen=True)
class _NumberRule:
    """A ``verl_ext.check`` number: from ``low`` to ``high``, ``low`` itself allowed or not; None (no limit) allowed
    when ``nullable``."""

    low: float
    high: float
    low_allowed: bool = True
    nullable: bool = False

    def check(self, key: str, value: Any) -> float:
        """``value`` as a float, or ``OptionsError`` naming ``key``. A number must be one: OmegaConf parses ``0.5``
        and ``1e-5``, but a quoted one stays a string, and ``true`` is not 1.0."""
        if math.isfinite(self.high):
            where = f"from {self.low:g} to {self.high:g}"
        else:
            where = f"{self.low:g} or more" if self.low_allowed else f"more than {self.low:g}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            unquote = ", without quotes" if isinstance(value, str) else ""
            raise OptionsError(f"{key} must be a number {where}{unquote}, got {value!r}")
        in_range = self.low <= value <= self.high and (self.low_allowed or value > self.low)
        if not (math.isfinite(value) and in_range):
            none = " (or null: no limit)" if self.nullable else ""
            raise OptionsError(f"{key} must be a finite number {where}{none}, got {value!r}")
        return float(value)


_NUMBERS: dict[str, _NumberRule] = {
    "template_view_rate": _NumberRule(0.0, 1.0),
    "logprob_atol": _NumberRule(0.0, math.inf),
    "template_view_budget_s": _NumberRule(0.0, math.inf, low_allowed=False, nullable=True),
}


def parse_causes(value: Any) -> frozenset[Cause]:
    """``"default"`` or None (the allowed-by-design set), or a list (or set) of cause names, where ``default`` adds
    the allowed-by-design set. Anything else raises ``OptionsError`` naming ``verl_ext.check.allowed_causes``."""
    if value in ("default", None):
        return ALLOWED_BY_DESIGN
    if not isinstance(value, (list, tuple, set, frozenset)):
        raise OptionsError(
            f"verl_ext.check.allowed_causes must be 'default' or a list of cause names, got {value!r}; e.g. "
            "verl_ext.check.allowed_causes=[default,bpe_remerge]"
        )
    out: set[Cause] = set()
    for k, name in enumerate(value):
        if name == "default":
            out |= ALLOWED_BY_DESIGN
        else:
            out.add(choice(f"verl_ext.check.allowed_causes[{k}]", Cause, name))
    return frozenset(out)


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
