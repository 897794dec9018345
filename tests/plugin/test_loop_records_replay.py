"""Every record the real loop writes replays to "the same": a rollout cut at the response budget included (the loop's
synthetic close after the cut lies past the trainer's cap), from this version's records and from older ones."""

from __future__ import annotations

import json
from pathlib import Path

from loop_harness import run_loop

from verl_ext.check.record import SCHEMA_VERSION
from verl_ext.cli.main import main as cli

PROMPT = [
    {"role": "system", "content": "Use the calculator tool."},
    {"role": "user", "content": "What is 12 * 7?"},
]
DIFFERS = "REPLAY DIFFERS FROM THE RECORD: "


def rewritten(path: Path, out: Path, edit) -> Path:
    """A copy of the record file with ``edit`` applied to its rollout line."""
    header, line = (json.loads(x) for x in path.read_text().splitlines())
    edit(line)
    out.write_text(json.dumps(header) + "\n" + json.dumps(line) + "\n")
    return out


def older(line: dict) -> None:
    """The line as version 2 wrote it: no response_length."""
    del line["response_length"]
    line["version"] = 2


def cut_one_more(line: dict) -> None:
    """What was trained lost its last sampled token: the record no longer holds what the trainer kept."""
    for key in ("input_ids", "loss_mask", "trainer_logprobs", "kinds", "turn_of"):
        line[key] = line[key][:-1]


def test_a_rollout_that_filled_its_budget_replays_the_same(make_loop, tmp_path, tiny_qwen3_dir, capsys):
    loop, server = make_loop(
        force_text="The answer is " + "very " * 40, response_length=24, verl_ext={"records": {"dir": str(tmp_path)}}
    )
    out = run_loop(loop, PROMPT)
    assert len(server.requests[0]["output_ids"]) == 24 and not out.extra_fields["verl_ext_check"]["truncated"]
    (path,) = tmp_path.glob("*.jsonl")
    line = json.loads(path.read_text().splitlines()[1])
    assert line["response_length"] == 24 and line["finish"] == {"2": "length"}
    tok = ["--tokenizer", str(tiny_qwen3_dir)]

    assert cli(["replay", str(path), *tok]) == 0, capsys.readouterr().out.splitlines()[0]
    assert f"recorded stream: the same {len(line['input_ids'])} tokens" in capsys.readouterr().out

    # a record from before response_length was written: the cut is inferred (only untrained tokens lie past it)
    old = rewritten(path, tmp_path / "old.jsonl", older)
    assert cli(["replay", str(old), *tok]) == 0, capsys.readouterr().out.splitlines()[0]
    capsys.readouterr()

    # the guards: a record short of what the trainer kept differs, in either version, at the token it lost
    end = len(line["input_ids"]) - 1
    for edits, name in (((cut_one_more,), "short.jsonl"), ((older, cut_one_more), "old-short.jsonl")):
        short = rewritten(path, tmp_path / name, lambda o, edits=edits: [e(o) for e in edits])
        assert cli(["replay", str(short), *tok]) == 1
        first = capsys.readouterr().out.splitlines()[0]
        assert (
            first.startswith(
                f"{DIFFERS}{short}:2: the replayed stream differs from the recorded input_ids at token {end} "
            )
            and "the record has nothing (its stream ends there)" in first
        )


def test_the_record_line_and_verls_batch_carry_the_same_rollout_id(make_loop, tmp_path):
    """The rollout id joins what arrives later (the trainer's numbers) to the record: the loop's output carries the
    id its record line holds, a new one per rollout; a line from before version 5 loads without one."""
    from verl_ext.check.record import RolloutRecord
    from verl_ext.telemetry.records import read_records

    loop, _ = make_loop(force_text="The answer is 84.", verl_ext={"records": {"dir": str(tmp_path)}})
    ids = [run_loop(loop, PROMPT).extra_fields["verl_ext_rollout_id"] for _ in range(2)]
    _, rollouts = read_records(sorted(tmp_path.glob("*.jsonl")))
    assert [r.rollout_id for r in rollouts] == ids and len(set(ids)) == 2 and all(len(i) == 32 for i in ids)
    line = rollouts[0].to_json()
    assert line["version"] == SCHEMA_VERSION and line["rollout_id"] == ids[0]
    old = {k: v for k, v in line.items() if k != "rollout_id"} | {"version": 4}
    assert RolloutRecord.from_json(old).rollout_id is None


def test_verls_batch_carries_where_each_engine_calls_tokens_start_in_the_response(make_loop):
    """``verl_ext_turn_starts`` (response-relative) is where each engine call's output begins: the engine's own
    prompt lengths say so, independently of the loop's bookkeeping, and each start opens a run of sampled tokens
    (mask 1 after mask 0) in what verl trains on."""
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call><|im_end|>'
    loop, server = make_loop(force_text=call)
    out = run_loop(loop, PROMPT)
    starts = out.extra_fields["verl_ext_turn_starts"]
    prompt = len(out.prompt_ids)
    assert len(server.requests) == 2
    assert starts == [len(r["prompt_ids"]) - prompt for r in server.requests]
    mask = out.response_mask
    opened = [i for i, m in enumerate(mask) if m == 1 and (i == 0 or mask[i - 1] == 0)]
    assert starts == opened
