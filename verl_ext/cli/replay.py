"""``verl-ext replay``: rebuild recorded conversations and show the stream, masks, repairs and invariants."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from verl_ext.check.image_view import ImageReplay, image_replay, replay_renderer
from verl_ext.check.numerics_record import NumericsRecord
from verl_ext.check.record import RecordedFailure, RolloutRecord
from verl_ext.check.record_header import RecordHeader
from verl_ext.check.replay_diff import fingerprint_difference, stream_difference
from verl_ext.check.revalidate import revalidated
from verl_ext.cli.options import distinct_files, renderer_from_args, stop_ids_from_args
from verl_ext.core.invariants import InvariantReport, check_invariants
from verl_ext.core.probe import probe_template
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.replay import RecordError, ReplayRecord, read_json_lines, replay
from verl_ext.core.trajectory import TokenTrajectory

LARGE_RECORD_IDS = 20_000  # about a second of replay on a contended 2-core machine


@dataclass(frozen=True)
class ReplayItem:
    """One conversation of a replay file: its line, what to replay, and, for a check's record, what was trained (to
    compare the replay with) and the file's header (the tokenizer and template the records were checked with)."""

    line: int
    record: ReplayRecord
    recorded: RolloutRecord | None = None
    header: RecordHeader | None = None


@dataclass(frozen=True)
class ReplayFile:
    """What one replay file or records file holds: the conversations to replay, and how many numerics lines (the
    trainer's numbers of rollouts, schema 6) were read, checked and skipped: they are not rollouts."""

    path: str
    items: list[ReplayItem]
    numerics: int = 0


def read_replay_file(path: str) -> ReplayFile:
    """Each conversation of a replay file or a check's record file (whose header line is read, not replayed), and
    the count of its numerics lines (each checked as ``NumericsRecord``, none replayed). A file of numerics lines
    only (``records/numerics-*.jsonl``) is read, not refused: ``records/*.jsonl`` names it beside the rollouts.
    Raises RecordError naming file:line for a malformed line (an unknown key or ``type``, a newer version), and for
    a file with no line at all."""
    items: list[ReplayItem] = []
    numerics = 0
    header: RecordHeader | None = None
    for line_no, obj in read_json_lines(path, "replay file"):
        where = f"{path}:{line_no}"
        kind = obj.get("type") if isinstance(obj, dict) else None
        if kind == "header":  # a check's record file: the template profile its rollouts were checked against
            header = RecordHeader.from_json(obj, where)
        elif kind == "numerics":  # the trainer's numbers of a rollout (schema 6): checked, nothing to replay
            NumericsRecord.from_json(obj, where)
            numerics += 1
        elif kind == "rollout":  # a check's record: the typed record's loader
            recorded = RolloutRecord.from_json(obj, where)
            items.append(ReplayItem(line_no, recorded.replay_record(where), recorded, header))
        elif kind is not None:
            raise RecordError(
                f'{where}: "type" {kind!r} is not a record type: a check\'s record file has "header", "rollout" and '
                '"numerics" lines; a replay record has no "type" (remove it)'
            )
        else:
            items.append(ReplayItem(line_no, ReplayRecord.from_json(obj, where=where), None, header))
    if not items and not numerics:
        raise RecordError(f"{path}: no records (the file is empty); write one JSON object per line")
    return ReplayFile(path, items, numerics)


def read_replay_files(paths: list[str]) -> list[ReplayFile]:
    """Every file read (``read_replay_file``). Raises RecordError when together they hold no conversation to replay
    (numerics lines only), naming the files and the fix."""
    read = [read_replay_file(path) for path in paths]
    if not any(f.items for f in read):
        numerics = sum(f.numerics for f in read)
        raise RecordError(
            f"{', '.join(paths)}: only numerics lines (the trainer's numbers, {numerics}), no rollout to replay; "
            "pass the rollout files beside them too (records/*.jsonl)"
        )
    return read


def skipped_numerics_note(read: list[ReplayFile]) -> str | None:
    """The one line that says how many numerics lines were read and skipped, and in which files (None: none)."""
    numerics = [f for f in read if f.numerics]
    if not numerics:
        return None
    n = sum(f.numerics for f in numerics)
    files = ", ".join(f.path for f in numerics)
    return (
        f"verl-ext replay: read {n} numerics line{'s' if n != 1 else ''} ({files}) and skipped them: they are the "
        "trainer's numbers of rollouts, not rollouts to replay (verl-ext report shows them)"
    )


@dataclass
class _Replayed:
    """One replayed conversation: the trajectory, its invariants, and how it compares with the record."""

    item: ReplayItem
    trajectory: TokenTrajectory
    report: InvariantReport
    differences: list[str] = field(default_factory=list)  # replay vs record: what was trained is not reproduced
    engine_failures: tuple[RecordedFailure, ...] = ()  # the stored verdict's and those re-validating finds
    images: ImageReplay | None = None  # how the record's images were replayed (None: it holds none)

    @property
    def ok(self) -> bool:
        """Invariants hold, the engine output is valid, and the record (if any) is reproduced."""
        t = self.trajectory
        return self.report.ok and not t.output_problems and not self.differences and not self.engine_failures

    def problems(self, where: str) -> list[tuple[str, str]]:
        """(headline, line) for every reason this record fails, the causes before their effects: the stored engine
        calls' failures (in the check's order), engine output the replay rejected, broken invariants, then where the
        replayed stream differs from what was trained. Each line names ``where`` (file:line), the kind and token."""
        out = [
            (_FAILS, f"{where}: engine view failure {_at(f.kind, f.position, f.turn)}: {f.detail}")
            for f in self.engine_failures
        ]
        t = self.trajectory
        for turn, problem in t.output_problems:
            position = t.turns[turn].prompt_length + problem.index if turn < len(t.turns) else None
            out.append(
                (_FAILS, f"{where}: engine output rejected {_at(problem.kind.value, position, turn)}: {problem.detail}")
            )
        out += [(_FAILS, f"{where}: invariant broken: {failure}") for failure in self.report.failures]
        out += [(_DIFFERS, f"{where}: {d}") for d in self.differences]
        return out


def _at(kind: str, position: int | None, turn: int | None) -> str:
    """``[kind] at token P (turn T)``: a failure's kind and where it is (the whole rollout when it has no token)."""
    where = "in the whole rollout" if position is None else f"at token {position}"
    return f"[{kind}] {where}" + ("" if turn is None else f" (turn {turn})")


def _replay_one(
    renderer: ChatRenderer, stops: list[int], item: ReplayItem, where: str, same_tokenizer: bool
) -> _Replayed:
    """Replay one conversation and, for a check's record, compare it with what was trained. ``same_tokenizer``
    false (the header names another tokenizer): the stored engine calls are not checked against this tokenizer's
    vocabulary and stop ids, which would invent failures (the header's difference is reported instead)."""
    n_sampled = sum(len(ids) for ids in item.record.sampled.values())
    if n_sampled >= LARGE_RECORD_IDS:  # seconds of work: say so, on stderr (stdout stays the result)
        print(f"replaying {where}: {len(item.record.messages)} messages, {n_sampled} sampled ids ...", file=sys.stderr)
        sys.stderr.flush()
    extra = item.recorded.extra if item.recorded is not None else {}
    images = image_replay(item.record.messages, extra, item.recorded.engine_calls if item.recorded is not None else ())
    t = replay(replay_renderer(renderer, images, extra), item.record, stops)
    done = _Replayed(item, t, check_invariants(t), images=images)
    if item.recorded is not None:
        # images replayed as the template writes them cannot reproduce the stream: said, never a false "differs"
        diff = stream_difference(item.recorded, t.input_ids, t.loss_mask, renderer)
        if diff and (images is None or images.expanded):
            done.differences.append(diff)
        vocab_size = renderer.vocab_size if same_tokenizer else None
        stop_ids = probe_template(renderer, stops).stop_id_set if same_tokenizer else frozenset()
        done.engine_failures = revalidated(item.recorded, vocab_size, stop_ids).check.engine_failures
    return done


@dataclass
class ReplayedFiles:
    """Replay files, replayed: every record with where it came from, the headers that name another tokenizer, and
    every failure and difference as (headline, line), the first being what the output's first line says."""

    done: list[tuple[str, _Replayed]]  # (file, replayed record), in file and line order
    headers: list[str]  # "FILE: ..." for each header whose fingerprint is not the replaying tokenizer's

    @property
    def problems(self) -> list[tuple[str, str]]:
        out = [(_DIFFERS, line) for line in self.headers]
        return out + [p for path, r in self.done for p in r.problems(f"{path}:{r.item.line}")]

    @property
    def ok(self) -> bool:
        """Every record reproduced, its engine calls valid, its invariants held, with the tokenizer it names."""
        return all(r.ok for _, r in self.done) and not self.headers


def replay_items(
    items: Iterable[tuple[str, ReplayItem]], renderer: ChatRenderer, stops: list[int], given: str
) -> ReplayedFiles:
    """Replay each (file, item) with ``renderer`` and the engine's extra ``stops``; ``given`` names the replaying
    tokenizer in a header's difference (``--tokenizer DIR``)."""
    out = ReplayedFiles([], [])
    mismatched: dict[int, bool] = {}  # id(header) -> the header names another tokenizer
    for path, item in items:
        header = item.header
        if header is not None and id(header) not in mismatched:
            diff = fingerprint_difference(header, renderer, given)
            mismatched[id(header)] = diff is not None
            if diff:
                out.headers.append(f"{path}: {diff}")
        same = header is None or not mismatched[id(header)]
        out.done.append((path, _replay_one(renderer, stops, item, f"{path}:{item.line}", same)))
    return out


def run_replay(args: argparse.Namespace) -> int:
    files = distinct_files(args.files, "replay")
    # Every file is read and type-checked before the tokenizer loads (seconds): a wrong path or a bad line costs
    # nothing. The records are held anyway: the replayed trajectories are printed at the end.
    read = read_replay_files(files)
    items = [(f.path, item) for f in read for item in f.items]
    note = skipped_numerics_note(read)
    if note:  # on stderr: stdout stays the result (its first line the first problem; --json one JSON value)
        print(note, file=sys.stderr)
    renderer = renderer_from_args(args.tokenizer, args)
    stops = stop_ids_from_args(renderer, args.stop)
    given = f"--tokenizer {args.tokenizer!r}"
    if args.chat_template:
        given += f" --chat-template {args.chat_template!r}"
    result = replay_items(items, renderer, stops, given)
    if args.json:
        for headline, line in result.problems:
            print(f"verl-ext replay: {headline}: {line}", file=sys.stderr)
        print(json.dumps([_json_result(r, result.headers, path) for path, r in result.done]))
    else:
        _print_text(renderer, result.done, result.problems, args)
    return 0 if result.ok else 1


# The first line of the output when a record is not reproduced (``_DIFFERS``) or fails on its own (``_FAILS``: an
# engine-view failure of its stored calls, engine output the replay rejects, a broken invariant).
_DIFFERS = "REPLAY DIFFERS FROM THE RECORD"
_FAILS = "REPLAY FAILS"


def _json_result(r: _Replayed, headers: list[str], path: str) -> dict[str, Any]:
    """One record's object of ``--json``: the trajectory, invariants, and the comparison with the record (``file``:
    the file it came from, when several were given)."""
    where = f"{path}:{r.item.line}"
    out: dict[str, Any] = {"file": path, "line": r.item.line, **r.trajectory.to_dict(), "ok": r.ok and not headers}
    out["failures"] = list(r.report.failures)
    if r.images is not None:
        out["images"] = r.images.to_json()
    if r.item.recorded is not None:
        compared = r.images is None or r.images.expanded
        out["recorded"] = {
            "same": (not r.differences and not headers) if compared else None,
            "differences": headers + [f"{where}: {d}" for d in r.differences],
            "engine_failures": [
                {"kind": f.kind, "turn": f.turn, "position": f.position, "detail": f.detail} for f in r.engine_failures
            ],
        }
    return out


def _print_text(
    renderer: ChatRenderer, done: list[tuple[str, _Replayed]], problems: list[tuple[str, str]], args: argparse.Namespace
) -> None:
    """The text output: every failure and difference first (the first line names the first, its kind and token),
    then one block per record."""
    if problems:
        headline, line = problems[0]
        print(f"{headline}: {line}")
        for _, line in problems[1:]:
            print(f"  also: {line}")
        print()
    for path, r in done:
        t = r.trajectory
        print(format_trajectory(renderer, t, f"{path}:{r.item.line}", per_token=args.tokens))
        if t.output_problems:
            print("engine output: REJECTED (these tokens are not trained)")
            for turn, problem in t.output_problems:
                print(f"  - turn {turn} [{problem.kind.value}]: {problem.detail}")
        if r.images is not None:
            print(f"images: {r.images.note}")
        if r.item.recorded is not None:
            same = f"the same {len(r.item.recorded.input_ids)} tokens and loss mask"
            if r.images is not None and not r.images.expanded:
                same = "not compared (the images could not be replayed as expanded: see 'images')"
            print(f"recorded stream: {'DIFFERS (see the first lines)' if r.differences else same}")
            if r.engine_failures:
                print(f"engine view (stored and re-validated): {len(r.engine_failures)} failures")
                for f in r.engine_failures:
                    print(f"  - turn {f.turn} [{f.kind}]: {f.detail}")
        print("invariants: " + ("all hold" if r.report.ok else "FAILED"))
        for failure in r.report.failures:
            print(f"  - {failure}")
        print()


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
