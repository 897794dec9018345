"""The ``numerics`` line of a record file (schema version 6): one rollout's trainer-vs-engine summaries.

The trainer's numbers arrive after the rollout's own line was written, in another process (the trainer's driver),
so they are a line of their own, keyed by the rollout id, never a rewrite of the rollout's line (records stay
append-only)::

    {"type": "numerics", "version": 6, "rollout_id": "...", "step": 3,
     "numerics": RolloutNumerics.to_json(), "thresholds": {"drift_mean_abs_delta": 0.05, "token_abs_delta": 0.5}}

``thresholds`` are the options the summaries were made with (``token_abs_delta`` decides their ``first_past``), so
the report's verdict is the one training saw. Loaders join the lines to rollouts by ``rollout_id``
(``NumericsIndex``); lines for the same rollout and source are parts of it (ranks that each saw part of its tokens)
and merge.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from verl_ext.core.messages import json_type
from verl_ext.core.numerics import NumericsOptions, RolloutNumerics
from verl_ext.core.replay import SCHEMA_VERSION, RecordError, check_version, unknown_key_error

NUMERICS_SINCE = 6  # the first schema version with numerics lines

_KEYS = ("type", "version", "rollout_id", "step", "numerics", "thresholds")
_THRESHOLDS = ("drift_mean_abs_delta", "token_abs_delta")


@dataclass(frozen=True)
class NumericsRecord:
    """One ``numerics`` line, typed."""

    numerics: RolloutNumerics
    options: NumericsOptions  # depth edges from the numerics, thresholds from the line
    version: int = SCHEMA_VERSION

    @property
    def rollout_id(self) -> str:
        return self.numerics.rollout_id

    @classmethod
    def of(cls, numerics: RolloutNumerics, options: NumericsOptions) -> NumericsRecord:
        """The line for ``numerics`` summarized with ``options``. Raises ValueError when the options' depth edges
        are not the ones the summaries were bucketed by."""
        if tuple(options.depth_edges) != numerics.depth_edges:
            raise ValueError(
                f"numerics of {numerics.rollout_id!r} were bucketed by depth edges {list(numerics.depth_edges)}, "
                f"not the options' {list(options.depth_edges)}: pass the options summarize_rollout was given"
            )
        return cls(numerics, options)

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "numerics",
            "version": self.version,
            "rollout_id": self.numerics.rollout_id,
            "step": self.numerics.step,
            "numerics": self.numerics.to_json(),
            "thresholds": {k: getattr(self.options, k) for k in _THRESHOLDS},
        }

    @classmethod
    def from_json(cls, obj: Any, where: str = "numerics record") -> NumericsRecord:
        """Raises RecordError naming ``where`` (file:line) and the key for a malformed line."""
        if not isinstance(obj, dict):
            raise RecordError(f"{where}: a numerics record must be a JSON object, got {json_type(obj)}")
        for key in obj:
            if key not in _KEYS:
                raise unknown_key_error(where, key, _KEYS, "a numerics record")
        version = check_version(where, obj.get("version"))
        if version < NUMERICS_SINCE:
            raise RecordError(
                f"{where}: a numerics line with schema version {version}: numerics lines exist from version "
                f"{NUMERICS_SINCE}; was the line edited? Records are written by verl_ext.records.dir"
            )
        try:
            numerics = RolloutNumerics.from_json(obj.get("numerics"), "numerics")
        except ValueError as exc:
            raise RecordError(f"{where}: {exc}") from None
        for key in ("rollout_id", "step"):
            if obj.get(key) != getattr(numerics, key):
                raise RecordError(
                    f"{where}: {key!r} {obj.get(key)!r} is not the numerics' own ({getattr(numerics, key)!r}); "
                    "a line holds one rollout's numbers"
                )
        raw = obj.get("thresholds") or {}
        if not isinstance(raw, dict):
            raise RecordError(f"{where}: 'thresholds' must be an object, got {json_type(raw)}")
        for key in raw:
            if key not in _THRESHOLDS:
                raise unknown_key_error(where, key, _THRESHOLDS, "a numerics record's thresholds", "thresholds.")
        options = NumericsOptions(depth_edges=numerics.depth_edges, **raw)
        problems = options.problems("thresholds")
        if problems:
            raise RecordError(f"{where}: {problems[0]}")
        return cls(numerics, options, version)


@dataclass(frozen=True)
class RolloutNumericsView:
    """What the records hold of one rollout's numbers: ``by_source`` (``"old_log_prob"``, ``"bypass_loss"``,
    ``"refeed"``), or, when empty, ``absent``: why there are none."""

    by_source: Mapping[str, NumericsRecord] = field(default_factory=dict)
    absent: str = ""

    @property
    def trainer(self) -> NumericsRecord | None:
        """The trainer's numbers (the recompute pass, or the policy loss in bypass mode); None without them."""
        return self.by_source.get("old_log_prob") or self.by_source.get("bypass_loss")


class NumericsIndex:
    """Numerics lines joined by rollout id, from every file of a run (the driver writes its own file)."""

    def __init__(self, records: Iterable[NumericsRecord] = ()) -> None:
        self._by_id: dict[str, dict[str, NumericsRecord]] = {}
        self.lines = 0
        for record in records:
            self.add(record)

    def add(self, record: NumericsRecord) -> None:
        self.lines += 1
        by_source = self._by_id.setdefault(record.rollout_id, {})
        source = record.numerics.source
        before = by_source.get(source)
        if before is None:
            by_source[source] = record
            return
        # parts of one rollout cover other turns; the same turn twice is the same tokens counted twice (a file
        # passed twice, a copied records folder), which a merge would silently double
        twice = sorted(set(before.numerics.by_turn) & set(record.numerics.by_turn))
        if twice:
            raise RecordError(
                f"two numerics lines of rollout {record.rollout_id!r} ({source}) both measure turn {twice[0]}: the "
                "same tokens twice (a records file passed twice, or a copy of one); pass each file of the records "
                "folder once"
            )
        try:
            merged = before.numerics.merge(record.numerics)
        except ValueError as exc:
            raise RecordError(f"two numerics lines of rollout {record.rollout_id!r} do not add up: {exc}") from None
        by_source[source] = NumericsRecord(merged, before.options, max(before.version, record.version))

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, rollout_id: object) -> bool:
        return rollout_id in self._by_id

    def rollout_ids(self) -> set[str]:
        return set(self._by_id)

    def view(self, rollout_id: str | None, version: int) -> RolloutNumericsView:
        """One rollout's numbers (``version``: its rollout line's schema version), or why there are none."""
        if version < NUMERICS_SINCE:
            return RolloutNumericsView(
                absent=f"record schema version {version}: written before the numerics view (version {NUMERICS_SINCE})"
            )
        if rollout_id is None:
            return RolloutNumericsView(absent="the rollout's record has no rollout_id to join the numbers by")
        found = self._by_id.get(rollout_id)
        if not found:
            why = (
                "no numerics line in these files holds this rollout's id"
                if self._by_id
                else "these files hold no numerics lines (the trainer's driver writes them to its own file in "
                "verl_ext.records.dir: pass every file of the folder)"
            )
            return RolloutNumericsView(absent=why)
        return RolloutNumericsView(dict(found))
