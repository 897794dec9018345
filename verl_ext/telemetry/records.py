"""Per-rollout JSONL records: the replay input format plus ids, masks, repairs, engine calls and findings.

Each process writes its own file (``<prefix>-<host>-<pid>.jsonl``), so Ray workers never interleave lines.
A file starts with a header line (``"type": "header"``: the template profile); records follow
(``"type": "rollout"``). When a file would exceed ``max_bytes`` it is rotated to ``.1``, ``.2``, ...; the
oldest beyond ``max_files`` is deleted, and that deletion is logged.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from verl_ext.check.engine_view import turn_at
from verl_ext.check.findings import CheckResult
from verl_ext.check.inputs import EngineCall, TrainerSample, rollout_assistants
from verl_ext.core.engine_output import NAN_HAPPENED
from verl_ext.core.probe import TemplateProfile
from verl_ext.core.replay import read_json_lines

log = logging.getLogger("verl_ext.records")

RECORD_VERSION = 1
_REPLAYABLE_FINISH = ("stop", "length", NAN_HAPPENED)  # what the replay format's "finish" accepts as a string


def rollout_record(
    calls: Sequence[EngineCall],
    sample: TrainerSample,
    messages: Sequence[Mapping[str, Any]],
    result: CheckResult,
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    step: int = 0,
    kinds: Sequence[str] | None = None,
    repairs: Sequence[Mapping[str, Any]] = (),
    extra: Mapping[str, Any] | None = None,
    prompt_messages: int | None = None,
) -> dict[str, Any]:
    """One rollout as a JSON object that ``verl-ext replay`` reads back (``sampled`` maps the k-th
    assistant message to engine call k) and ``verl-ext report`` renders."""
    assistants = rollout_assistants(messages, len(calls), prompt_messages)
    by_message = list(zip(assistants, calls, strict=False))
    stream = list(sample.stream)
    p = len(sample.prompt_ids)
    if kinds is None:  # no trajectory: what the engine record alone can tell
        sampled = {i for c in calls for i in range(c.output_start, c.output_end)}
        kinds = ["prompt" if i < p else "sampled" if i in sampled else "context" for i in range(len(stream))]
    if len(kinds) < len(stream):
        raise ValueError(f"rollout_record: {len(kinds)} kinds for a stream of {len(stream)} tokens; pass one per token")
    turn_of = [turn_at(calls, i) for i in range(len(stream))]
    return {
        "type": "rollout",
        "version": RECORD_VERSION,
        "step": step,
        "messages": [dict(m) for m in messages],
        "tools": [dict(t) for t in tools] if tools else None,
        "chat_template_kwargs": dict(chat_template_kwargs or {}),
        "prompt_messages": prompt_messages if prompt_messages is not None else (assistants[0] if assistants else None),
        "sampled": {str(i): list(c.output_ids) for i, c in by_message},
        "logprobs": {str(i): list(c.logprobs) for i, c in by_message if c.logprobs is not None},
        "finish": {str(i): c.finish_reason for i, c in by_message if c.finish_reason in _REPLAYABLE_FINISH},
        "prompt_length": len(sample.prompt_ids),
        "input_ids": stream,
        "loss_mask": [0] * p + list(sample.response_mask),
        "trainer_logprobs": None if sample.response_logprobs is None else [0.0] * p + list(sample.response_logprobs),
        "kinds": list(kinds)[: len(stream)],  # the trainer's stream may be cut at its response length
        "turn_of": turn_of,  # engine call (assistant turn) each token belongs to
        "repairs": [dict(r) for r in repairs],
        "engine_calls": [
            {
                "prompt_length": len(c.prompt_ids),
                "output_ids": list(c.output_ids),
                "logprobs": None if c.logprobs is None else list(c.logprobs),
                "finish_reason": c.finish_reason,
            }
            for c in calls
        ],
        "check": result.to_dict(),
        **(dict(extra) if extra else {}),
    }


def header_record(profile: TemplateProfile) -> dict[str, Any]:
    return {"type": "header", "version": RECORD_VERSION, "template_profile": profile.to_dict()}


class RecordWriter:
    """Appends records as JSON lines to this process's file under ``directory``, with size-capped rotation."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        header: Mapping[str, Any] | None = None,
        *,
        max_bytes: int = 64 * 1024 * 1024,
        max_files: int = 4,
        prefix: str = "rollouts",
    ) -> None:
        if max_bytes <= 0 or max_files < 1:
            raise ValueError(f"records need max_bytes > 0 and max_files >= 1, got {max_bytes} and {max_files}")
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / f"{prefix}-{socket.gethostname()}-{os.getpid()}.jsonl"
        self.header = dict(header) if header else None
        self.max_bytes = max_bytes
        self.max_files = max_files
        self.dropped_files = 0

    def write(self, record: Mapping[str, Any]) -> None:
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
        data = line.encode("utf-8")
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
                fh.write((json.dumps(self.header, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8"))
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


def read_records(paths: Sequence[str | os.PathLike[str]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(headers, rollouts) from record files, in file order. Malformed lines raise ValueError naming file:line."""
    headers: list[dict[str, Any]] = []
    rollouts: list[dict[str, Any]] = []
    for path in paths:
        for n, obj in read_json_lines(path, "records file", hint="; is this a records file?"):
            kind = obj.get("type") if isinstance(obj, dict) else None
            if kind == "header":
                headers.append(obj)
            elif kind == "rollout":
                rollouts.append(obj)
            else:
                raise ValueError(f'{path}:{n}: not a verl_ext record (no "type": "rollout" or "header")')
    return headers, rollouts
