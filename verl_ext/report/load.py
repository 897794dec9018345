"""Read record files, keeping where each rollout came from so the report can name it."""

from __future__ import annotations

import dataclasses
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from verl_ext.check.numerics_record import NumericsIndex
from verl_ext.check.record import RolloutRecord
from verl_ext.check.record_header import HeaderProfile
from verl_ext.check.revalidate import revalidated
from verl_ext.core.replay import RecordError
from verl_ext.telemetry.records import read_record_files


@dataclass(frozen=True)
class RolloutRef:
    """A rollout record and where it came from."""

    file: str  # the file's name, as given on the command line
    index: int  # 1-based position among the file's rollout records
    record: RolloutRecord
    name: str = ""  # a gateway rollout's session and branch (``load_records`` names it), else ""

    @property
    def where(self) -> str:
        """``FILE #N``: where the rollout is in its file (what an error about its record names)."""
        return f"{Path(self.file).name} #{self.index}"

    @property
    def label(self) -> str:
        """How the page names the rollout: a gateway branch by the session id its harness chose and its branch
        number, any other rollout by ``FILE #N``."""
        return self.name or self.where


@dataclass(frozen=True)
class Records:
    """Record files read: their names, the distinct template profiles of their headers, every rollout, and the
    numerics lines of every file joined by rollout id (the driver writes them to a file of its own)."""

    files: tuple[str, ...]
    profiles: tuple[HeaderProfile, ...]  # distinct template profiles from the headers, by fingerprint
    rollouts: tuple[RolloutRef, ...]
    numerics: NumericsIndex = field(default_factory=NumericsIndex, compare=False)


def load_records(paths: Sequence[str | os.PathLike[str]]) -> Records:
    """Every rollout record of the files, typed (``RolloutRecord.from_json``). Raises ValueError (one line naming
    file:line, and the key and fix for a field of the wrong type) for a malformed record, and when the files hold
    no rollout (an empty report would look like a clean run)."""
    profiles: dict[str, HeaderProfile] = {}
    rollouts: list[RolloutRef] = []
    numerics = NumericsIndex()
    for path in paths:
        # One file at a time, so each rollout keeps its file and position.
        files = read_record_files([path])
        for h in files.headers:
            if h.template_profile:
                profiles.setdefault(h.fingerprint, h.profile)
        rollouts += [RolloutRef(str(path), i, r) for i, r in enumerate(files.rollouts, 1)]
        for line in files.numerics:
            try:
                numerics.add(line)
            except RecordError as exc:
                raise RecordError(f"{path}: {exc}") from None
    rollouts = _named_by_session(rollouts)
    if not rollouts:
        names = ", ".join(str(p) for p in paths)
        only = (
            f" ({numerics.lines} numerics lines: the trainer's numbers, which join rollouts)" if numerics.lines else ""
        )
        raise RecordError(
            f"no rollout records in {names}{only}; pass the JSONL files the consistency check writes "
            '(lines with "type": "rollout"), not only their headers'
        )
    return Records(tuple(str(p) for p in paths), tuple(profiles.values()), tuple(rollouts), numerics)


def session_name(record: RolloutRecord) -> str:
    """``session ID · branch N`` for a gateway rollout, "" for another (or a malformed ``gateway`` key, which the
    report's fork reader names as an error)."""
    gateway = record.extra.get("gateway")
    if not isinstance(gateway, dict):
        return ""
    session, branch = gateway.get("session"), gateway.get("branch")
    if not isinstance(session, str) or not isinstance(branch, int) or isinstance(branch, bool):
        return ""
    return f"session {session} · branch {branch}"


def _named_by_session(rollouts: list[RolloutRef]) -> list[RolloutRef]:
    """Gateway rollouts named by session and branch; a name two rollouts would share (the same session id in two
    gateways' files) keeps its file as given too, so that every rollout's name stays its own."""
    names = [session_name(ref.record) for ref in rollouts]
    seen = Counter(names)
    return [
        dataclasses.replace(ref, name=name if seen[name] == 1 else f"{name} ({ref.file} #{ref.index})") if name else ref
        for ref, name in zip(rollouts, names, strict=True)
    ]


def revalidated_records(records: Records, vocab_size: int | None) -> Records:
    """``records`` with every rollout's stored engine calls checked again (``check.revalidate``): a failure the
    stored verdict does not name is added to it, so the report never trusts a verdict its data contradicts.
    ``vocab_size`` is the decoding tokenizer's (None: ids are not checked against a vocabulary)."""
    stop_ids = {s.id for p in records.profiles for s in p.stop_ids}
    rollouts = tuple(
        dataclasses.replace(ref, record=revalidated(ref.record, vocab_size, stop_ids)) for ref in records.rollouts
    )
    return dataclasses.replace(records, rollouts=rollouts)
