"""Record files: each finished rollout's ``RolloutRecord`` (``verl_ext.check.record``) as one JSON line.

Each process writes its own file (``<prefix>-<host>-<pid>.jsonl``), so Ray workers never interleave lines.
A file starts with a header line (``"type": "header"``: the template profile); records follow
(``"type": "rollout"``), and, from schema version 6, the trainer's numbers of a rollout as a line of their own
(``"type": "numerics"``, keyed by ``rollout_id``: ``numerics_record``; the trainer's driver writes them to its own
file, after the rollout's line). Every line carries ``"version"``: the record schema version (``SCHEMA_VERSION``). Lines
are strict JSON: a float that is not finite (a NaN logprob) is written as the string ``"NaN"``, ``"Infinity"`` or
``"-Infinity"``, which the record's loader reads back as that float. When a file would exceed ``max_bytes`` it is
rotated to ``.1``, ``.2``, ...; the oldest beyond ``max_files`` is deleted, and that deletion is logged.

The writer touches the file system only in ``write``: building one never fails on a folder a node cannot create
(a read-only or unmounted path), so the agent loop that owns it can count the failure and keep training.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_ext.check.numerics_record import NumericsRecord
from verl_ext.check.record import SCHEMA_VERSION, RolloutRecord
from verl_ext.check.record_header import RecordHeader
from verl_ext.check.record_json import json_safe
from verl_ext.core.numerics import NumericsOptions, RolloutNumerics
from verl_ext.core.replay import RecordError, read_json_lines
from verl_ext.core.template_profile import TemplateProfile

log = logging.getLogger("verl_ext.records")


def header_record(profile: TemplateProfile) -> RecordHeader:
    """A record file's first line: the template profile every rollout in the file was checked against."""
    return RecordHeader(SCHEMA_VERSION, profile.to_dict())


def numerics_record(numerics: RolloutNumerics, options: NumericsOptions) -> NumericsRecord:
    """The ``numerics`` line of one rollout's summaries (``summarize_rollout`` with ``options``), for
    ``RecordWriter.write``: appended beside the rollout's line, joined to it by ``rollout_id`` when read."""
    return NumericsRecord.of(numerics, options)


Line = RolloutRecord | RecordHeader | NumericsRecord


def to_json_line(record: Line | Mapping[str, Any]) -> str:
    """One record as a strict JSON line (no bare ``NaN``): non-finite floats become strings (module docstring)."""
    obj = record.to_json() if isinstance(record, Line) else record
    try:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:  # a NaN or infinity somewhere: rewrite only then (the walk costs a pass over the record)
        text = json.dumps(json_safe(obj), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text + "\n"


class RecordWriter:
    """Appends records as JSON lines to this process's file under ``directory``, with size-capped rotation. The
    folder is created by the first ``write`` (never by the constructor)."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        header: RecordHeader | None = None,
        *,
        max_bytes: int = 64 * 1024 * 1024,
        max_files: int = 4,
        prefix: str = "rollouts",
    ) -> None:
        if max_bytes <= 0 or max_files < 1:
            raise ValueError(f"records need max_bytes > 0 and max_files >= 1, got {max_bytes} and {max_files}")
        self.directory = Path(directory)
        self.path = self.directory / f"{prefix}-{socket.gethostname()}-{os.getpid()}.jsonl"
        self.header = header
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.dropped_files = 0

    def write(self, record: RolloutRecord | NumericsRecord | Mapping[str, Any]) -> None:
        """Append one record (a ``RolloutRecord``, a ``NumericsRecord``, or any JSON object) as a line; rotate first
        when it would pass ``max_bytes``. Raises OSError when the folder cannot be created or the file written,
        TypeError for a value JSON cannot hold."""
        data = to_json_line(record).encode("utf-8")
        self.directory.mkdir(parents=True, exist_ok=True)
        size = self.path.stat().st_size if self.path.exists() else 0
        if size and size + len(data) > self.max_bytes:
            self._rotate()
            size = 0
        if len(data) > self.max_bytes:
            log.warning(
                "a rollout record of %d bytes exceeds records max_bytes=%d; written whole to %s (raise max_bytes)",
                len(data),
                self.max_bytes,
                self.path,
            )
        with self.path.open("ab") as fh:
            if size == 0 and self.header is not None:
                fh.write(to_json_line(self.header).encode("utf-8"))
            fh.write(data)

    def _rotate(self) -> None:
        """current -> .1 -> .2 ... ; ``max_files`` counts the current file and its numbered predecessors."""
        self.dropped_files += 1 if self.max_files == 1 or self._numbered(self.max_files - 1).exists() else 0
        if self.max_files == 1:
            log.warning("records: max_files=1, so %s starts over to stay within max_bytes", self.path)
            self.path.unlink()
            return
        last = self._numbered(self.max_files - 1)
        if last.exists():
            log.warning("records: deleted %s to stay within max_files=%d", last, self.max_files)
            last.unlink()
        for n in range(self.max_files - 2, 0, -1):
            if self._numbered(n).exists():
                self._numbered(n).rename(self._numbered(n + 1))
        self.path.rename(self._numbered(1))

    def _numbered(self, n: int) -> Path:
        return self.path.with_name(f"{self.path.stem}.{n}.jsonl")


@dataclass(frozen=True)
class RecordFiles:
    """What record files hold, in file order: headers, rollouts and numerics lines."""

    headers: list[RecordHeader]
    rollouts: list[RolloutRecord]
    numerics: list[NumericsRecord]


_RECORDS_HINT = "; is this a records file? Pass the JSONL files the check writes (verl_ext.records.dir)"


def _not_a_record(obj: object) -> str:
    """Why a JSON line is not a record line, and what to pass instead."""
    if isinstance(obj, dict) and "messages" in obj and "type" not in obj:
        return (
            "a replay record (`verl-ext replay` reads it), not a check's record; pass the JSONL files the check "
            "writes (verl_ext.records.dir, or the gateway's --records)"
        )
    return (
        'not a verl_ext record (no "type": "rollout", "numerics" or "header"); pass the JSONL files the check writes '
        "(verl_ext.records.dir, or the gateway's --records)"
    )


def read_record_files(paths: Sequence[str | os.PathLike[str]]) -> RecordFiles:
    """Every line of the record files, typed and checked field by field. Raises RecordError (a ValueError) with one
    line naming file:line (and the key) for a malformed line, a line that is not a record, a wrong type, or a
    schema version newer than this verl_ext reads."""
    out = RecordFiles([], [], [])
    for path in paths:
        for n, obj in read_json_lines(path, "records file", hint=_RECORDS_HINT):
            kind = obj.get("type") if isinstance(obj, dict) else None
            if kind == "header":
                out.headers.append(RecordHeader.from_json(obj, f"{path}:{n}"))
            elif kind == "rollout":
                out.rollouts.append(RolloutRecord.from_json(obj, f"{path}:{n}"))
            elif kind == "numerics":
                out.numerics.append(NumericsRecord.from_json(obj, f"{path}:{n}"))
            else:
                raise RecordError(f"{path}:{n}: {_not_a_record(obj)}")
    return out


def read_records(
    paths: Sequence[str | os.PathLike[str]],
) -> tuple[list[RecordHeader], list[RolloutRecord]]:
    """(headers, rollouts) from record files, in file order (``read_record_files``; numerics lines are read and
    checked, not returned)."""
    files = read_record_files(paths)
    return files.headers, files.rollouts


def records_folder_problem(path: str | os.PathLike[str]) -> str | None:
    """Why records cannot be written in ``path`` (created if missing, then a file written and removed in it), as
    ``"ExceptionType: reason"``; None when they can. Training's preflight and ``verl-ext gateway`` check with it
    before they start."""
    import tempfile

    try:
        Path(path).mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".verl_ext-write-check-"):
            pass
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    return None
