"""TEST ONLY: faults the CPU engine can be told to inject, to prove that the numerics view localizes each one.

Set in the rollout config, beside the other engines' options (verl's ``rollout.engine_kwargs.<engine>``)::

    +actor_rollout_ref.rollout.engine_kwargs.verl_ext_cpu.faults=[{kind:past_depth,depth:200,shift:-0.5}]

Each fault changes only the numbers the engine *reports* (or, for ``stale_weights``, which weights it serves),
never what it samples: the token ids, their count, the stop reason, the prefix cache and the extra fields are those
of a clean run with the same seed. Kinds:

* ``past_depth`` (``depth``, ``shift``): the reported logprob of every output token at absolute position
  ``>= depth`` (prompt included: position ``len(prompt_ids) + i`` for output token ``i``) gets ``shift`` added;
* ``turn`` (``turn``, ``shift``): every reported logprob of the rollout's engine call number ``turn`` (0 = the
  first) gets ``shift`` added. The engine numbers calls itself: a request whose prompt extends an earlier request's
  prompt + output is that request's next call (verl gives every turn a fresh request id);
* ``bf16``: every reported logprob is rounded through bfloat16 (as a bf16 engine would report it);
* ``stale_weights`` (``versions``): a weight sync carrying ``global_steps`` in ``versions`` is received but not
  applied: the engine keeps serving the weights of the sync before it, while reporting the new version. verl syncs
  with ``global_steps=k`` after step ``k`` (the first sync, before step 1, carries 0): ``versions: [1]`` makes step
  2's rollouts stale;
* ``score_shift`` (``shift``): the engine's scoring path (``score``, the re-feed audit's prefill) reports its
  logprobs shifted: a scoring path that lies, which the audit's canary must refuse;
* ``abort_after`` (``tokens``, optional ``wait_s``, default 300): a partial rollout on cue. The first request served
  on each weight version that samples (no forced turn) and resumes nothing is parked after ``tokens`` sampled ids,
  the model released, until verl's next ``abort_all_requests`` (at most ``wait_s`` seconds; then it is returned
  aborted anyway, counted as ``abort_after_timeout``): it returns those ids aborted, and verl_ext's client resumes it
  after the weight update (cpu_pause.py). Changes when a request stops, never what it samples.

``shift`` must be negative (a logprob stays at most 0). The reported-number faults take two optional selectors:
``rows_containing`` (a text; only requests whose decoded prompt contains it, e.g. one dataset row's question) and
``versions`` (only requests served on weights of these ``global_steps``). Unknown kinds, keys or bad values are
refused with the fix. Never set any of these in a real run.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.core.bounded_cache import LruCache
from verl_ext.core.errors import OptionsError

FAULT_KINDS = ("past_depth", "turn", "bf16", "stale_weights", "score_shift", "abort_after")
_KEYS = {
    "past_depth": {"depth", "shift"},
    "turn": {"turn", "shift"},
    "bf16": set(),
    "stale_weights": {"versions"},
    "score_shift": {"shift"},
    "abort_after": {"tokens"},
}
_OPTIONAL = {"abort_after": {"wait_s"}}
_NO_SELECTORS = frozenset({"stale_weights", "score_shift", "abort_after"})
_SELECTORS = {"rows_containing", "versions"}
_WHERE = "rollout.engine_kwargs.verl_ext_cpu.faults"


@dataclass(frozen=True)
class Fault:
    """One configured fault (see the module docstring); ``versions`` is the selector, or for ``stale_weights`` the
    syncs that are not applied."""

    kind: str
    depth: int = 0
    turn: int = 0
    shift: float = 0.0
    rows_containing: str | None = None
    versions: frozenset[int] | None = None
    tokens: int = 0  # abort_after: sampled ids before the request is parked
    wait_s: float = 300.0  # abort_after: how long a parked request waits for verl's abort

    def selects(self, version: int | None, prompt_text: Callable[[], str]) -> bool:
        """Whether a request served on weights ``version`` with this prompt is hit (``prompt_text`` decodes it, only
        when a row selector needs it)."""
        if self.versions is not None and version not in self.versions:
            return False
        return self.rows_containing is None or self.rows_containing in prompt_text()


def _int(entry: Mapping[str, Any], key: str, index: int, minimum: int = 0) -> int:
    value = entry[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise OptionsError(f"{_WHERE}[{index}].{key} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _shift(entry: Mapping[str, Any], index: int) -> float:
    value = entry["shift"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value >= 0:
        raise OptionsError(
            f"{_WHERE}[{index}].shift must be a finite negative number (a reported logprob must stay at most 0), "
            f"got {value!r}; e.g. shift: -0.5"
        )
    return float(value)


def parse_faults(raw: Any) -> tuple[Fault, ...]:
    """The faults of ``engine_kwargs.verl_ext_cpu.faults`` (a list of mappings; None or empty: none). Raises
    ``OptionsError`` naming the entry and the fix for an unknown kind or key, a missing key or a bad value."""
    if raw is None:
        return ()
    if isinstance(raw, (Mapping, str, bytes)) or not isinstance(raw, Sequence):
        raise OptionsError(f"{_WHERE} must be a list of faults, e.g. [{{kind: bf16}}], got {raw!r}")
    faults = []
    for index, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            raise OptionsError(f"{_WHERE}[{index}] must be a mapping with a kind, got {entry!r}")
        entry = dict(entry)
        kind = entry.pop("kind", None)
        if kind not in _KEYS:
            raise OptionsError(f"{_WHERE}[{index}].kind must be one of {list(FAULT_KINDS)}, got {kind!r}")
        needed = _KEYS[kind]
        allowed = needed | _OPTIONAL.get(kind, set()) | (_SELECTORS if kind not in _NO_SELECTORS else set())
        unknown = sorted(set(entry) - allowed)
        missing = sorted(needed - set(entry))
        if unknown or missing:
            raise OptionsError(
                f"{_WHERE}[{index}] (kind {kind}): unknown keys {unknown}, missing keys {missing}; a {kind} fault "
                f"takes {sorted(needed)}" + (f" and optionally {sorted(allowed - needed)}" if allowed - needed else "")
            )
        versions = entry.get("versions")
        if versions is not None:
            if isinstance(versions, (str, bytes, Mapping)) or not isinstance(versions, Sequence) or not versions:
                raise OptionsError(f"{_WHERE}[{index}].versions must be a non-empty list of steps, got {versions!r}")
            versions = frozenset(_int({"versions": v}, "versions", index) for v in versions)
        rows = entry.get("rows_containing")
        if rows is not None and (not isinstance(rows, str) or not rows):
            raise OptionsError(f"{_WHERE}[{index}].rows_containing must be a non-empty text, got {rows!r}")
        faults.append(
            Fault(
                kind=kind,
                depth=_int(entry, "depth", index) if "depth" in entry else 0,
                turn=_int(entry, "turn", index) if "turn" in entry else 0,
                shift=_shift(entry, index) if "shift" in entry else 0.0,
                rows_containing=rows,
                versions=versions,
                tokens=_int(entry, "tokens", index, minimum=1) if "tokens" in entry else 0,
                wait_s=_seconds(entry, index) if "wait_s" in entry else 300.0,
            )
        )
    return tuple(faults)


def _seconds(entry: Mapping[str, Any], index: int) -> float:
    value = entry["wait_s"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise OptionsError(f"{_WHERE}[{index}].wait_s must be a positive number of seconds, got {value!r}")
    return float(value)


def bf16_round(value: float) -> float:
    """``value`` rounded to the nearest bfloat16 (ties to even), as torch's ``.to(torch.bfloat16)`` rounds."""
    import torch

    return float(torch.tensor(value, dtype=torch.float32).to(torch.bfloat16).float())


def perturbed(log_probs: Sequence[float], prompt_len: int, call_index: int, faults: Sequence[Fault]) -> list[float]:
    """The logprobs a request reports under ``faults`` (those that select it): each fault applied in order to its
    positions. ``call_index``: the request's engine call number within its rollout."""
    out = [float(x) for x in log_probs]
    for fault in faults:
        if fault.kind == "past_depth":
            first = max(0, fault.depth - prompt_len)
            out[first:] = [x + fault.shift for x in out[first:]]
        elif fault.kind == "turn" and call_index == fault.turn:
            out = [x + fault.shift for x in out]
        elif fault.kind == "bf16":
            out = [bf16_round(x) for x in out]
    return out


def _digest(ids: Sequence[int]) -> bytes:
    return hashlib.blake2b(b",".join(str(int(i)).encode() for i in ids), digest_size=16).digest()


class CallNumbers:
    """Which engine call of its rollout a request is: 1 + the number of the longest earlier request whose prompt +
    output the prompt starts with, else 0. Bounded: the ``maxsize`` most recent calls are remembered."""

    def __init__(self, maxsize: int = 4096) -> None:
        self._seen: LruCache[tuple[int, bytes], int] = LruCache("CPU engine fault call numbers", maxsize)

    def number(self, prompt_ids: Sequence[int]) -> int:
        for length in sorted({length for length, _ in self._seen}, reverse=True):
            if length <= len(prompt_ids):
                found = self._seen.get((length, _digest(prompt_ids[:length])))
                if found is not None:
                    return found + 1
        return 0

    def remember(
        self, prompt_ids: Sequence[int], output_ids: Sequence[int], number: int, aborted: bool = False
    ) -> None:
        """``aborted``: the call stopped early; the call that resumes it (its prompt + output) keeps its number."""
        sequence = [*prompt_ids, *output_ids]
        self._seen[(len(sequence), _digest(sequence))] = number - 1 if aborted else number
