"""Replay every record a test wrote, in process (the test's renderer: no tokenizer load per test), and require that
replay says "the same" for each: what the record's conversation rebuilds is what was trained."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from verl_ext.cli.replay import read_replay_file, replay_items


def assert_records_replay(folder: Path, renderer: Any) -> int:
    """Every rollout record under ``folder`` replays to its recorded stream and loss mask with the header's
    tokenizer, and replay finds no failure the record's own check did not (a rollout that ended on invalid engine
    output is recorded with that failure, and replay names it again). Returns how many records were replayed."""
    items = [(str(f), item) for f in sorted(folder.glob("*.jsonl")) for item in read_replay_file(str(f)).items]
    result = replay_items(items, renderer, [], "the test's renderer")
    assert not result.headers, result.headers[0]
    for path, r in result.done:
        where = f"{path}:{r.item.line}"
        assert not r.differences, f"{where}: {r.differences[0]}"
        if r.item.recorded is None or r.item.recorded.check.engine_ok:
            assert r.ok, r.problems(where)[0]
    return len(result.done)
