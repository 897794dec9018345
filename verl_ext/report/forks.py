"""The gateway's sessions in the report: each branch a session's requests started, and what made it fork.

A gateway record (``verl_ext.gateway.conclude``) names its session and branch under ``gateway``, and, for a
branch a request forked, the cause: the parent branch, the message index and the field that differed, what
differed, and how many of the parent's turns the branch replayed; where a trainer took the branch
(``verl_ext_gateway_agent``), ``trains`` says which of its engine turns it trains (verl_ext.gateway.training).
Rollouts of other loops have no ``gateway`` key
and are not counted here. The key is read field by field: a malformed one is an error naming the rollout.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.core.messages import json_type
from verl_ext.core.replay import RecordError
from verl_ext.report.load import RolloutRef

SESSION_LIMIT = 200  # forked sessions listed in the page; the rest are counted


@dataclass(frozen=True)
class ForkCause:
    """Why a branch exists: the ``gateway.fork`` object of its record."""

    parent: int
    message: int
    field: str
    detail: str
    replayed_turns: int


@dataclass(frozen=True)
class BranchTrains:
    """What a trainer trains of a branch: the record's ``gateway.trains`` object."""

    turns: tuple[int, ...]
    tokens: int
    elsewhere: tuple[tuple[int, int], ...]  # (turn, the later branch that trains it)
    untrained: str | None

    def describe(self) -> str:
        """One line for the page: the turns trained here, those trained in a later branch, or why none is."""
        if not self.turns:
            said = f"nothing: {self.untrained}" if self.untrained else "nothing"
        else:
            said = f"turn{'s' if len(self.turns) > 1 else ''} {', '.join(map(str, self.turns))} ({self.tokens} tokens)"
        moved = "; ".join(f"turn {t} in branch {b}" for t, b in self.elsewhere)
        return f"{said}; {moved}" if moved else said


@dataclass(frozen=True)
class GatewayBranch:
    """A rollout's ``gateway`` key: its session, its branch number, why the session ended, its fork (None for a
    session's first branch)."""

    session: str
    branch: int
    ended: str
    fork: ForkCause | None
    trains: BranchTrains | None = None  # None: no trainer's decision recorded (the standalone gateway)


@dataclass(frozen=True)
class BranchRow:
    """One branch of a forked session as the page lists it."""

    label: str  # the rollout's label (``FILE #N``)
    branch: GatewayBranch
    ok: bool
    engine_ok: bool
    turns: int
    example: str | None  # anchor of its token-by-token view, when the page has one


@dataclass(frozen=True)
class ForkedSession:
    """A session with at least one fork: its branches in branch order."""

    file: str
    session: str
    branches: tuple[BranchRow, ...]

    @property
    def forks(self) -> int:
        """Branches of this session that a request forked."""
        return sum(row.branch.fork is not None for row in self.branches)


@dataclass(frozen=True)
class ForkCounts:
    """What the summary says of the gateway's rollouts."""

    sessions: int  # gateway sessions (file, session id)
    branches: int  # gateway rollouts
    forks: int  # branches a request forked
    forked_sessions: int
    fields: dict[str, int]  # the field that differed -> forks, most common first


def gateway_branch(ref: RolloutRef) -> GatewayBranch | None:
    """The rollout's ``gateway`` key, type-checked; None for a rollout no gateway wrote. Raises RecordError naming
    the rollout and the key for a malformed one."""
    value = ref.record.extra.get("gateway")
    if value is None:
        return None
    where = f"{ref.where}: gateway"
    obj = _object(value, where)
    fork = obj.get("fork")
    cause = None
    if fork is not None:
        f = _object(fork, f"{where}.fork")
        cause = ForkCause(
            parent=_field(f, "parent", int, f"{where}.fork"),
            message=_field(f, "message", int, f"{where}.fork"),
            field=_field(f, "field", str, f"{where}.fork"),
            detail=_field(f, "detail", str, f"{where}.fork"),
            replayed_turns=_field(f, "replayed_turns", int, f"{where}.fork"),
        )
    return GatewayBranch(
        session=_field(obj, "session", str, where),
        branch=_field(obj, "branch", int, where),
        ended=_field(obj, "ended", str, where),
        fork=cause,
        trains=None if obj.get("trains") is None else _trains(obj["trains"], f"{where}.trains"),
    )


def _trains(value: Any, where: str) -> BranchTrains:
    obj = _object(value, where)
    turns = obj.get("turns")
    if not isinstance(turns, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in turns):
        raise RecordError(f"{where}.turns must be a list of integers, got {json_type(turns)}")
    elsewhere = obj.get("elsewhere", [])
    if not isinstance(elsewhere, list):
        raise RecordError(f"{where}.elsewhere must be a list, got {json_type(elsewhere)}")
    moved = tuple(
        (_field(_object(e, f"{where}.elsewhere"), "turn", int, where), _field(e, "branch", int, where))
        for e in elsewhere
    )
    untrained = obj.get("untrained")
    return BranchTrains(
        tuple(turns),
        _field(obj, "tokens", int, where),
        moved,
        None if untrained is None else _field(obj, "untrained", str, where),
    )


def _object(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise RecordError(f"{where} must be an object, got {json_type(value)}; gateway records come from the gateway")
    return value


def _field(obj: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    value = obj.get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise RecordError(
            f"{where}.{key} must be {'an integer' if kind is int else 'a string'}, got {json_type(value)}; "
            "gateway records come from the gateway (verl_ext.gateway.conclude)"
        )
    return value


def _by_session(rollouts: Sequence[RolloutRef]) -> dict[tuple[str, str], list[tuple[RolloutRef, GatewayBranch]]]:
    """Gateway rollouts grouped by (file, session id), in file order: one gateway process writes one file."""
    out: dict[tuple[str, str], list[tuple[RolloutRef, GatewayBranch]]] = {}
    for ref in rollouts:
        branch = gateway_branch(ref)
        if branch is not None:
            out.setdefault((ref.file, branch.session), []).append((ref, branch))
    return out


def fork_counts(rollouts: Sequence[RolloutRef]) -> ForkCounts:
    """The counts over every gateway rollout (zeros where none is)."""
    sessions = _by_session(rollouts)
    forks = [b.fork for group in sessions.values() for _, b in group if b.fork is not None]
    return ForkCounts(
        sessions=len(sessions),
        branches=sum(len(group) for group in sessions.values()),
        forks=len(forks),
        forked_sessions=sum(any(b.fork for _, b in group) for group in sessions.values()),
        fields=dict(Counter(f.field for f in forks).most_common()),
    )


def forked_sessions(rollouts: Sequence[RolloutRef], examples: Mapping[str, str]) -> tuple[list[ForkedSession], int]:
    """The sessions with a fork, most forks first (ties in file order), each with every branch it recorded, and
    how many were left out past ``SESSION_LIMIT``. ``examples``: rollout label -> anchor of its example."""
    out = []
    for (file, session), group in _by_session(rollouts).items():
        if not any(b.fork for _, b in group):
            continue
        rows = tuple(
            BranchRow(
                ref.label,
                b,
                ref.record.check.ok,
                ref.record.check.engine_ok,
                ref.record.check.num_turns,
                examples.get(ref.label),
            )
            for ref, b in sorted(group, key=lambda pair: pair[1].branch)
        )
        out.append(ForkedSession(file, session, rows))
    out.sort(key=lambda s: -s.forks)  # stable: ties keep file order
    return out[:SESSION_LIMIT], max(0, len(out) - SESSION_LIMIT)
