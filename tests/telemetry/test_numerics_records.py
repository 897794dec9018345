"""Schema 6: the trainer's numbers of a rollout as a ``numerics`` line of their own, written after the rollout's
line by another writer (the driver's file), joined to it by rollout id on load; older records load and say why the
view is absent; the two-part verdict compares numbers only where the tokens are the engine's."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from numerics_rollouts import numerics_of_record
from rollouts import TOOLS
from test_metrics_and_records import two_turn_rollout

from verl_ext.check import ConsistencyChecker
from verl_ext.check.numerics_record import NUMERICS_SINCE, NumericsIndex, NumericsRecord
from verl_ext.check.numerics_verdict import record_verdict, two_part_verdict
from verl_ext.check.record import SCHEMA_VERSION, Rollout
from verl_ext.cli.main import main as cli
from verl_ext.core.numerics import NumericsOptions
from verl_ext.core.probe import probe_template
from verl_ext.core.replay import RecordError
from verl_ext.telemetry.records import RecordWriter, header_record, numerics_record, read_record_files, read_records


@pytest.fixture
def run(renderer_for, tmp_path):
    """Two checked Qwen3 rollouts in the loop's file, and their numbers (the second drifting from its turn 1) in
    the driver's own file: (rollouts file, numerics file, records)."""
    r = renderer_for("qwen3")
    loop = RecordWriter(tmp_path / "records", header_record(probe_template(r)), prefix="rollouts")
    driver = RecordWriter(tmp_path / "records", prefix="numerics")
    records = []
    for step in (1, 2):
        ro = two_turn_rollout(r)
        rollout = Rollout.of(ro.calls, ro.sample(), ro.messages, TOOLS, step=step)
        records.append(rollout.record(ConsistencyChecker(r).check_rollout(rollout)))
        loop.write(records[-1])
    opts = NumericsOptions()
    driver.write(numerics_record(numerics_of_record(records[0], lambda p, t: 1e-6), opts))
    driver.write(numerics_record(numerics_of_record(records[1], lambda p, t: -0.7 if t == 1 else 1e-6), opts))
    return loop.path, driver.path, records


def test_numerics_lines_join_their_rollouts_by_id_across_files(run):
    rollouts_file, numerics_file, records = run
    assert json.loads(numerics_file.read_text().splitlines()[0])["type"] == "numerics"
    files = read_record_files([rollouts_file, numerics_file])
    assert [r.rollout_id for r in files.rollouts] == [r.rollout_id for r in records]
    index = NumericsIndex(files.numerics)
    verdicts = [record_verdict(r.check, index.view(r.rollout_id, r.version)) for r in files.rollouts]
    assert [(v.tokens, v.numbers) for v in verdicts] == [("ok", "ok"), ("ok", "drift")]
    drift = verdicts[1].numerics
    assert drift is not None and drift.turn == 1
    assert drift.position == records[1].engine_calls[1].output_start  # the first sampled token of turn 1
    assert "turn 1" in verdicts[1].text and "position" in verdicts[1].text
    # read_records (every other caller) still returns (headers, rollouts): the numerics lines are checked, not shown
    headers, rollouts = read_records([rollouts_file, numerics_file])
    assert len(headers) == 1 and rollouts == files.rollouts


def test_the_rollout_line_is_never_rewritten(run):
    rollouts_file, _, records = run
    lines = [json.loads(x) for x in rollouts_file.read_text().splitlines()]
    assert [x["type"] for x in lines] == ["header", "rollout", "rollout"]
    assert all("numerics" not in x for x in lines)


def test_older_records_load_and_say_why_the_view_is_absent(run, tmp_path):
    rollouts_file, _, records = run
    header, line, _ = rollouts_file.read_text().splitlines()
    for version in range(1, NUMERICS_SINCE):
        old = {**json.loads(line), "version": version}
        if version < 5:
            old.pop("rollout_id")
        path = tmp_path / f"v{version}.jsonl"
        path.write_text(header + "\n" + json.dumps(old) + "\n")
        (loaded,) = read_record_files([path]).rollouts
        v = record_verdict(loaded.check, NumericsIndex().view(loaded.rollout_id, loaded.version))
        assert (v.tokens, v.numbers) == ("ok", "absent")
        assert f"schema version {version}: written before the numerics view (version 6)" in v.numbers_detail


def test_a_current_record_without_its_numerics_says_which_file_is_missing(run):
    rollouts_file, _, records = run
    files = read_record_files([rollouts_file])
    view = NumericsIndex(files.numerics).view(records[0].rollout_id, SCHEMA_VERSION)
    assert not view.by_source and "pass every file of the folder" in view.absent
    other = NumericsIndex([numerics_record(numerics_of_record(records[1]), NumericsOptions())])
    assert "no numerics line in these files holds this rollout's id" in other.view(records[0].rollout_id, 6).absent


def test_numbers_are_not_compared_where_the_tokens_are_not_the_engines(run):
    _, _, records = run
    numerics = numerics_of_record(records[1], lambda p, t: -0.3)
    v = two_part_verdict(False, 0, numerics, NumericsOptions())
    assert (v.tokens, v.numbers, v.numerics) == ("failure", "not compared", None)
    assert "numbers not compared" in v.numbers_detail
    v = two_part_verdict(True, 2, numerics, NumericsOptions())  # a template defect: still the engine's tokens
    assert (v.tokens, v.numbers) == ("defect", "drift")


def test_parts_of_one_rollout_merge_and_other_sources_stay_apart(run):
    _, _, records = run
    rec = records[1]
    first = rec.engine_calls[1].output_start
    whole = numerics_of_record(rec, lambda p, t: 0.01)
    head = numerics_of_record(
        dataclasses.replace(rec, loss_mask=tuple(m if i < first else 0 for i, m in enumerate(rec.loss_mask))),
        lambda p, t: 0.01,
    )
    tail = numerics_of_record(
        dataclasses.replace(rec, loss_mask=tuple(m if i >= first else 0 for i, m in enumerate(rec.loss_mask))),
        lambda p, t: 0.01,
    )
    refeed = numerics_of_record(rec, lambda p, t: 0.5, source="refeed")
    opts = NumericsOptions()
    index = NumericsIndex([numerics_record(x, opts) for x in (head, tail, refeed)])
    view = index.view(rec.rollout_id, SCHEMA_VERSION)
    assert set(view.by_source) == {"old_log_prob", "refeed"}
    merged = view.by_source["old_log_prob"].numerics
    assert merged.overall.count == whole.overall.count and math.isclose(merged.overall.sum_abs, whole.overall.sum_abs)
    assert view.trainer is view.by_source["old_log_prob"]
    # the same line twice (a file passed twice) is the same tokens twice: refused, never doubled
    with pytest.raises(RecordError, match="both measure turn 0.*pass each file of the records folder once"):
        NumericsIndex([numerics_record(x, opts) for x in (head, tail, head)])


def test_the_thresholds_a_line_was_written_with_decide_its_verdict(run, tmp_path):
    _, _, records = run
    numerics = numerics_of_record(records[0], lambda p, t: 0.02)
    strict = NumericsOptions(drift_mean_abs_delta=0.01)
    line = json.loads(json.dumps(numerics_record(numerics, strict).to_json()))
    loaded = NumericsRecord.from_json(line, "f:1")
    assert loaded.options == strict
    view = NumericsIndex([loaded]).view(records[0].rollout_id, SCHEMA_VERSION)
    assert record_verdict(records[0].check, view).numbers == "drift"
    assert two_part_verdict(True, 0, numerics, NumericsOptions()).numbers == "ok"
    with pytest.raises(ValueError, match="bucketed by depth edges"):
        numerics_record(numerics, NumericsOptions(depth_edges=(0, 100)))


def test_an_overflowing_k3_is_written_as_strict_json_and_read_back(run, tmp_path):
    _, _, records = run
    numerics = numerics_of_record(records[0], lambda p, t: 800.0)  # exp(800) overflows: k3 is infinite
    assert numerics.overall.sum_k3 == math.inf
    writer = RecordWriter(tmp_path / "n", prefix="numerics")
    writer.write(numerics_record(numerics, NumericsOptions()))
    text = writer.path.read_text()
    assert '"sum_k3":"Infinity"' in text
    (loaded,) = read_record_files([writer.path]).numerics
    assert loaded.numerics == numerics


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda o: o.update(rollout_id="other"), "'rollout_id' 'other' is not the numerics' own"),
        (lambda o: o.update(step=9), "'step' 9 is not the numerics' own"),
        (lambda o: o.update(version=5), "numerics lines exist from version 6"),
        (lambda o: o.update(version=SCHEMA_VERSION + 1), "is newer than this verl_ext reads"),
        (lambda o: o.update(numerix={}), "unknown key 'numerix'"),
        (
            lambda o: o["thresholds"].update(drift_mean_abs_delta=-1),
            "thresholds.drift_mean_abs_delta must be a positive",
        ),
        (lambda o: o["thresholds"].update(drift=1), "unknown key 'thresholds.drift'"),
        (lambda o: o["numerics"]["overall"].update(count="3"), "numerics.overall.count must be a non-negative integer"),
        (lambda o: o["numerics"].update(source="trainer"), "numerics.source must be one of"),
    ],
)
def test_a_malformed_numerics_line_is_refused_naming_file_line_and_key(run, tmp_path, edit, message):
    rollouts_file, numerics_file, _ = run
    obj = json.loads(numerics_file.read_text().splitlines()[0])
    edit(obj)
    path = tmp_path / "edited.jsonl"
    path.write_text(json.dumps(obj) + "\n")
    with pytest.raises(RecordError, match=f"^{path}:1: .*") as info:
        read_record_files([rollouts_file, path])
    assert message in str(info.value)


def test_replay_reads_files_with_numerics_lines(run, tokenizer_dirs, tmp_path, capsys):
    rollouts_file, numerics_file, _ = run
    both = tmp_path / "both.jsonl"
    both.write_text(rollouts_file.read_text() + numerics_file.read_text())
    tok = str(tokenizer_dirs["qwen3"])
    capsys.readouterr()
    # the records folder as the docs say to pass it: the numerics-only file is read and skipped, said in one line
    assert cli(["replay", str(rollouts_file), str(numerics_file), "--tokenizer", tok]) == 0
    out, err = capsys.readouterr()
    assert out.count("== ") == 2 and out.count("invariants: all hold") == 2  # both rollouts replayed
    said = [line for line in err.splitlines() if "numerics line" in line]
    assert said == [
        f"verl-ext replay: read 2 numerics lines ({numerics_file}) and skipped them: they are the trainer's numbers "
        "of rollouts, not rollouts to replay (verl-ext report shows them)"
    ]
    assert cli(["replay", str(both), "--json", "--tokenizer", tok]) == 0
    out, err = capsys.readouterr()
    assert len(json.loads(out)) == 2 and f"read 2 numerics lines ({both})" in err  # stdout stays one JSON value
    assert cli(["replay", str(rollouts_file), "--tokenizer", tok]) == 0
    assert "numerics line" not in capsys.readouterr().err  # no numerics line read: nothing said
    # nothing to replay at all: refused, naming the count and the fix
    assert cli(["replay", str(numerics_file), "--tokenizer", tok]) == 2
    err = capsys.readouterr().err
    assert "only numerics lines (the trainer's numbers, 2), no rollout to replay" in err
    assert "records/*.jsonl" in err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert cli(["replay", str(rollouts_file), str(empty), "--tokenizer", tok]) == 2
    assert "no records (the file is empty)" in capsys.readouterr().err
