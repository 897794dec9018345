"""``verl-ext replay``: rebuild recorded conversations and show the stream, masks, repairs and invariants."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from typing import Any

from verl_ext.check.record import RolloutRecord
from verl_ext.cli.options import renderer_from_args, stop_ids_from_args
from verl_ext.core.invariants import check_invariants
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.replay import RecordError, ReplayRecord, read_json_lines, replay
from verl_ext.core.trajectory import TokenTrajectory

LARGE_RECORD_IDS = 20_000  # about a second of replay on a contended 2-core machine


def read_records(path: str) -> Iterator[tuple[int, ReplayRecord]]:
    """(line number, conversation) for each record of a replay file or a check's record file (whose header line
    is skipped). Raises RecordError naming file:line for a malformed record, and for a file with none."""
    count = 0
    for line_no, obj in read_json_lines(path, "replay file"):
        if isinstance(obj, dict) and obj.get("type") == "header":
            continue  # a rollout records file's header (the template profile); not a conversation
        count += 1
        where = f"{path}:{line_no}"
        if isinstance(obj, dict) and obj.get("type") == "rollout":  # a check's record: the typed record's loader
            yield line_no, RolloutRecord.from_json(obj, where).replay_record(where)
        else:
            yield line_no, ReplayRecord.from_json(obj, where=where)
    if count == 0:
        raise RecordError(f"{path}: no records (the file is empty); write one JSON object per line")


def run_replay(args: argparse.Namespace) -> int:
    renderer = renderer_from_args(args.tokenizer, args)
    stops = stop_ids_from_args(renderer, args.stop)
    results: list[dict[str, Any]] = []
    all_ok = True
    for line_no, record in read_records(args.file):
        n_sampled = sum(len(ids) for ids in record.sampled.values())
        if n_sampled >= LARGE_RECORD_IDS:  # seconds of work: say so, on stderr (stdout stays the result)
            print(
                f"replaying {args.file}:{line_no}: {len(record.messages)} messages, {n_sampled} sampled ids ...",
                file=sys.stderr,
                flush=True,
            )
        t = replay(renderer, record, stops)
        report = check_invariants(t)
        ok = report.ok and not t.output_problems  # an invalid engine output is never a clean replay
        all_ok &= ok
        if args.json:
            results.append({"line": line_no, **t.to_dict(), "ok": ok, "failures": list(report.failures)})
        else:
            print(format_trajectory(renderer, t, f"{args.file}:{line_no}", per_token=args.tokens))
            if t.output_problems:
                print("engine output: REJECTED (these tokens are not trained)")
                for turn, problem in t.output_problems:
                    print(f"  - turn {turn} [{problem.kind.value}]: {problem.detail}")
            print("invariants: " + ("all hold" if report.ok else "FAILED"))
            for failure in report.failures:
                print(f"  - {failure}")
            print()
    if args.json:
        print(json.dumps(results))
    return 0 if all_ok else 1


def format_trajectory(renderer: ChatRenderer, t: TokenTrajectory, title: str, per_token: bool) -> str:
    mask = t.loss_mask
    lines = [f"== {title}: {len(t.input_ids)} tokens, {sum(mask)} trained (mask 1), {len(t.turns)} engine calls"]
    if per_token:
        lines.append(f"{'pos':>5} {'id':>7} {'kind':<8} {'turn':>4} {'mask':>4} {'logprob':>9}  token")
        for i, tok in enumerate(t.input_ids):
            lines.append(
                f"{i:>5} {tok:>7} {t.kinds[i].value:<8} {t.turn_of[i]:>4} {mask[i]:>4} {t.logprobs[i]:>9.4f}  "
                f"{renderer.decode([tok])!r}"
            )
    else:
        lines.append(f"{'span':>11} {'kind':<8} {'turn':>4} {'mask':>4}  text")
        start = 0
        for i in range(1, len(t.input_ids) + 1):
            if i == len(t.input_ids) or (t.kinds[i], t.turn_of[i]) != (t.kinds[start], t.turn_of[start]):
                text = renderer.decode(t.input_ids[start:i])
                if len(text) > 80:
                    text = text[:50] + " ... " + text[-25:]
                kind = t.kinds[start]
                lines.append(f"{start:>5}-{i - 1:<5} {kind.value:<8} {t.turn_of[start]:>4} {mask[start]:>4}  {text!r}")
                start = i
    lines.append("repairs:" if t.edits else "repairs: none")
    for e in t.edits:
        lines.append(f"  turn {e.turn} @{e.position} {e.kind.value:<16} {renderer.decode(e.token_ids)!r}: {e.detail}")
    return "\n".join(lines)
