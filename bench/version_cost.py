"""The per-turn cost of recording and checking policy versions at 1,000 turns with a resume every 10 turns, against
the same rollout without aborts, engine time excluded; and the memory per token each keeps.

One tool-calling rollout of ``--turns`` turns is generated once (``--tokens`` output ids per turn, a tool reply of
``--reply`` ids after each; ids and logprobs drawn up front, so no engine runs in the timing). Two arms walk it turn by
turn as verl_ext_tool_agent's engine_turn and runtime do:

- ``no aborts``: each turn is one engine call: its segment (``core.version_spans.segment``: the CRCs of its ids and
  logprobs), the ids joined, the call recorded (``EngineCalls.record``);
- ``resume every N``: every ``--every``-th turn is aborted after half its ids and resumed (two attempts, the second
  sent on the next version with its prompt CRC): two segments, the ids and logprobs joined;

then, per arm, the rollout's ``RolloutVersions`` is built, the version view runs (``check.version_view``) and the
``versions`` object is written as the record writes it (``json.dumps``). Printed: each arm's time per turn (fastest
of ``--reps``, process CPU), the ratio resume/no-abort (goal at most 1.1x), and the bytes per output token each arm
keeps (the engine calls and the versions, traced with tracemalloc) and their difference (goal within 4 bytes).
Ratios against the baseline of the same run; never asserted timings. The machine and its load are printed.

    PYTHONPATH=. .venv/bin/python bench/version_cost.py [--turns 1000] [--every 10] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tracemalloc
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _timing import fastest  # noqa: E402

from verl_ext.check.findings import Cause  # noqa: E402
from verl_ext.check.inputs import EngineCalls  # noqa: E402
from verl_ext.check.version_view import version_findings  # noqa: E402
from verl_ext.core.prompt_ids import PromptIds  # noqa: E402
from verl_ext.core.version_spans import (  # noqa: E402
    DISPATCH_VERSION_FIELD,
    PROMPT_CRC_FIELD,
    STOP_VERSION_FIELD,
    RolloutVersions,
    ids_crc,
    segment,
)


def _allowed(cause: Cause) -> bool:
    return cause.kind.value == "allowed"


def make_turns(
    turns: int, tokens: int, reply: int, seed: int = 0
) -> tuple[list[int], list[tuple[list[int], list[float], list[int]]]]:
    """The first prompt, and per turn (output ids, logprobs, the tool reply's ids)."""
    rng = random.Random(seed)
    prompt = [rng.randrange(100, 30000) for _ in range(200)]
    out = []
    for _ in range(turns):
        ids = [rng.randrange(100, 30000) for _ in range(tokens)]
        out.append((ids, [-rng.random() * 3 for _ in ids], [rng.randrange(100, 30000) for _ in range(reply)]))
    return prompt, out


def record_calls(prompt: list[int], turns: list[tuple[list[int], list[float], list[int]]]) -> EngineCalls:
    """The rollout's engine calls as the runtime records them (the same in both arms: a resumed turn's joined output
    is its ids): recorded once, outside the timing."""
    calls = EngineCalls()
    stream = array("i", prompt)  # an append-only stream, as the trajectory's
    for ids, lps, reply in turns:
        calls.record(PromptIds(stream), ids, lps, "stop")
        stream.extend(ids + reply)
    return calls


def walk(calls: EngineCalls, turns: list[tuple[list[int], list[float], list[int]]], every: int) -> tuple[Any, ...]:
    """One arm: every turn's segments (``every`` 0: no aborts), the rollout's versions, their check and their JSON."""
    segments: list[list[dict[str, Any]]] = []
    version = 3
    for k, (ids, lps, _reply) in enumerate(turns):
        attempts = [(ids, lps)]
        if every and k % every == every - 1:
            h = len(ids) // 2
            attempts = [(ids[:h], lps[:h]), (ids[h:], lps[h:])]
        joined: list[int] = []
        joined_lps: list[float] = []
        segs = []
        for j, (a_ids, a_lps) in enumerate(attempts):
            report = {DISPATCH_VERSION_FIELD: version, STOP_VERSION_FIELD: version}
            if j:  # what the engine reports of the resume's prompt (its own CRC: engine time, not timed here)
                report[PROMPT_CRC_FIELD] = _prompt_crcs[(k, len(joined))]
            stop = "abort" if j + 1 < len(attempts) else "stop"
            segs.append(segment(len(joined), a_ids, stop, stop != "abort", report, {}, a_lps))
            joined += a_ids  # engine_turn's join
            joined_lps += a_lps
            if stop == "abort":
                version += 1
        segments.append(segs)
    versions = RolloutVersions.of(segments, trained_step=version + 1)
    findings, counts = version_findings(calls, versions, _allowed)
    assert not findings and counts.resumes == (len(turns) // every if every else 0), (findings, counts)
    return versions, json.dumps(versions.to_json())


_prompt_crcs: dict[tuple[int, int], int] = {}


def engine_prompt_crcs(prompt: list[int], turns: list[tuple[list[int], list[float], list[int]]], every: int) -> None:
    """The prompt CRC the engine reports for each resume (the engine's work: computed before the timing)."""
    stream = list(prompt)
    for k, (ids, _lps, reply) in enumerate(turns):
        if every and k % every == every - 1:
            h = len(ids) // 2
            _prompt_crcs[(k, h)] = ids_crc(stream + ids[:h])
        stream = stream + ids + reply


def kept_bytes(fn: Callable[[], tuple[Any, ...]]) -> int:
    """Bytes the arm's result keeps (its versions and their JSON line part), traced."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    kept = fn()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del kept
    return after - before


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--turns", type=int, default=1000)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--tokens", type=int, default=60, help="output ids per turn")
    p.add_argument("--reply", type=int, default=40, help="tool reply ids after each turn")
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args()
    prompt, turns = make_turns(a.turns, a.tokens, a.reply)
    engine_prompt_crcs(prompt, turns, a.every)
    calls = record_calls(prompt, turns)
    arms = {
        "no aborts": lambda: walk(calls, turns, 0),
        f"resume every {a.every}": lambda: walk(calls, turns, a.every),
    }
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f} (1 min)")
    print(f"{a.turns} turns, {a.tokens} output ids + {a.reply} reply ids each; fastest of {a.reps}, process CPU")
    best = fastest(arms, a.reps)
    base = best["no aborts"][1]
    tokens = a.turns * a.tokens
    mem = {name: kept_bytes(fn) for name, fn in arms.items()}
    for name, (_wall, cpu) in best.items():
        print(
            f"  {name:>16}: {1e6 * cpu / a.turns:8.1f} us/turn  {cpu / base:5.2f}x   "
            f"{mem[name] / tokens:6.2f} bytes/output token kept"
        )
    resume = f"resume every {a.every}"
    print(
        f"resume / no aborts: {best[resume][1] / base:.2f}x (goal <= 1.1x); memory "
        f"{(mem[resume] - mem['no aborts']) / tokens:+.2f} bytes/token (goal within 4)"
    )


if __name__ == "__main__":
    main()
