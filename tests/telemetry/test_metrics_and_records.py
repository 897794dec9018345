"""tito/ metrics aggregate check results; records round-trip through `verl-ext replay`; rotation caps size."""

from __future__ import annotations

import dataclasses
import json
import logging

from rollouts import TOOLS, Turn, call, run, tool_result

from verl_ext.check import Cause, ConsistencyChecker
from verl_ext.check.record import SCHEMA_VERSION, Rollout
from verl_ext.cli.main import main as cli
from verl_ext.core.probe import probe_template
from verl_ext.core.trajectory import RepairKind
from verl_ext.telemetry.metrics import aggregate
from verl_ext.telemetry.records import RecordWriter, header_record, read_records

IM_END, ENDOFTEXT = 151645, 151643
TOOL_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call>'


def two_turn_rollout(r, stop_on_tool_call: bool = False):
    first = r.encode(TOOL_CALL) + ([] if stop_on_tool_call else [IM_END])
    answer = [*r.encode("<think>\n\n</think>\n\nThe answer is 2."), ENDOFTEXT]
    return run(
        r,
        [
            Turn(first, {"role": "assistant", "content": "", "tool_calls": [call()]}, [tool_result()]),
            Turn(answer, {"role": "assistant", "content": "The answer is 2."}),
        ],
    )


def checked(r, ro, response_length=None, **record):
    """(the loop's Rollout, its check result); ``record``: more ``Rollout.of`` arguments (step, kinds, ...)."""
    t = ro.trajectory
    repairs = {k.value: sum(e.kind is k for e in t.edits) for k in RepairKind}
    rollout = Rollout.of(ro.calls, ro.sample(response_length), ro.messages, TOOLS, repairs=repairs, **record)
    return rollout, ConsistencyChecker(r).check_rollout(rollout)


def test_metrics_count_findings_repairs_and_truncation(renderer_for):
    r = renderer_for("qwen3")
    ro_a, ro_b = two_turn_rollout(r), two_turn_rollout(r, stop_on_tool_call=True)
    _, a = checked(r, ro_a)
    _, b = checked(r, ro_b, response_length=len(ro_b.sample().response_ids) - 3)
    m = aggregate([a, b])
    assert m["tito/rollouts_checked"] == 2 and m["tito/engine_view_failures"] == 0
    assert m["tito/findings/eos_alias"] == 2  # both final turns stopped on <|endoftext|>
    # a's final turn and b's </tool_call> stop; b's final close lies beyond the cut
    assert m["tito/findings/synthetic_close"] == 2
    assert m["tito/repairs/boundary"] == 2 and m["tito/repairs/synthetic_close"] == 3
    assert m["tito/truncated_rollouts"] == 1 and m["tito/lost_sampled_tokens"] == 2  # "." and <|endoftext|>
    assert m["tito/defect_rate"] == 0.0
    assert all(f"tito/findings/{c.value}" in m for c in Cause)
    assert aggregate([])["tito/defect_rate"] == 0.0


def test_records_replay_to_the_same_stream(renderer_for, tokenizer_dirs, tmp_path, capsys):
    r = renderer_for("qwen3")
    ro = two_turn_rollout(r, stop_on_tool_call=True)
    t = ro.trajectory
    rollout, result = checked(r, ro, step=7, kinds=[k.value for k in t.kinds], repair_log=t.to_dict()["repairs"])
    writer = RecordWriter(tmp_path, header_record(probe_template(r)))
    written = rollout.record(result)
    writer.write(written)
    headers, rollouts = read_records([writer.path])
    assert len(headers) == 1 and headers[0].template_profile["verdict"] == "repairable"
    (rec,) = rollouts
    assert rec == written  # the typed record round-trips through its file exactly
    assert (
        rec.version == SCHEMA_VERSION
        and json.loads(writer.path.read_text().splitlines()[1])["version"] == SCHEMA_VERSION
    )
    assert rec.step == 7 and list(rec.input_ids) == t.input_ids and rec.check.ok
    assert {f.cause for f in rec.check.findings} >= {"eos_alias", "synthetic_close"}
    assert rec.turn_of == rollout.turn_of and rec.turn_of[-1] == 1  # the answer's tokens are turn 1

    assert cli(["replay", str(writer.path), "--tokenizer", str(tokenizer_dirs["qwen3"]), "--json"]) == 0
    (replayed,) = json.loads(capsys.readouterr().out)
    assert replayed["input_ids"] == t.input_ids and replayed["loss_mask"] == t.loss_mask
    assert replayed["logprobs"] == t.logprobs


def test_rotation_keeps_max_files_and_a_header_in_each(renderer_for, tmp_path, caplog):
    r = renderer_for("qwen3")
    ro = two_turn_rollout(r)
    rollout, result = checked(r, ro)
    record = rollout.record(result)
    size = len(json.dumps(record.to_json(), separators=(",", ":")))
    writer = RecordWriter(tmp_path, header_record(probe_template(r)), max_bytes=int(size * 2.5), max_files=3)
    with caplog.at_level(logging.WARNING, logger="verl_ext.records"):
        for step in range(9):
            writer.write(dataclasses.replace(record, step=step))
    files = sorted(tmp_path.iterdir())
    expected = [writer.path.name.replace(".jsonl", suffix) for suffix in (".1.jsonl", ".2.jsonl", ".jsonl")]
    assert [f.name for f in files] == expected
    assert all(f.stat().st_size <= size * 2.5 for f in files)
    headers, rollouts = read_records(files)
    steps = sorted(r.step for r in rollouts)
    assert len(headers) == 3 and steps == list(range(steps[0], 9)) and steps[0] > 0  # newest kept, oldest dropped
    assert writer.dropped_files >= 1 and "deleted" in caplog.text


def test_bad_records_name_file_and_line(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"type": "header", "version": 2, "template_profile": {}}\nnot json\n')
    try:
        read_records([bad])
    except ValueError as exc:
        assert f"{bad}:2" in str(exc)
    else:
        raise AssertionError("a malformed line must raise")
