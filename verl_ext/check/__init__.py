"""The end-of-rollout consistency check: are the trainer's tokens the engine's, and why does the stream
differ from the chat template's rendering? Depends on the token core only (no verl, Ray or torch)."""

from verl_ext.check.checker import ConsistencyChecker
from verl_ext.check.findings import ALLOWED_BY_DESIGN, Cause, CheckResult, EngineFailure, FailureKind, Finding, Span
from verl_ext.check.inputs import EngineCall, TrainerSample
from verl_ext.check.policy import CheckMode, CheckPolicy, ConsistencyError, Enforcer, explain
from verl_ext.check.record import SCHEMA_VERSION, Rollout, RolloutRecord

__all__ = [
    "ALLOWED_BY_DESIGN",
    "Cause",
    "CheckMode",
    "CheckPolicy",
    "CheckResult",
    "ConsistencyChecker",
    "ConsistencyError",
    "EngineCall",
    "EngineFailure",
    "Enforcer",
    "FailureKind",
    "Finding",
    "Rollout",
    "RolloutRecord",
    "SCHEMA_VERSION",
    "Span",
    "TrainerSample",
    "explain",
]
