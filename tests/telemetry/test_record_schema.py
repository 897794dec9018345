"""The typed, versioned rollout record: what its files hold, and how its loader treats old, new and wrong files."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
from rollouts import TOOLS
from test_metrics_and_records import two_turn_rollout

from verl_ext.check import ConsistencyChecker, FailureKind
from verl_ext.check.record import SCHEMA_VERSION, Rollout, RolloutRecord
from verl_ext.cli.main import main as cli
from verl_ext.core.errors import TrajectoryError
from verl_ext.core.probe import probe_template
from verl_ext.core.replay import RecordError
from verl_ext.report.tokens import Token, token_view
from verl_ext.telemetry.records import RecordWriter, header_record, read_records


def _strict(text: str) -> object:
    """json.loads that refuses NaN and Infinity, as strict JSON readers (jq, JavaScript) do."""

    def refuse(name: str) -> None:
        raise ValueError(f"bare {name} in the record file")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def written(renderer_for, tmp_path):
    """A record file with one checked two-turn Qwen3 rollout: (writer, rollout, record)."""
    r = renderer_for("qwen3")
    ro = two_turn_rollout(r, stop_on_tool_call=True)
    t = ro.trajectory
    rollout = Rollout.of(ro.calls, ro.sample(), ro.messages, TOOLS, step=3, kinds=[k.value for k in t.kinds])
    record = rollout.record(ConsistencyChecker(r).check_rollout(rollout))
    writer = RecordWriter(tmp_path / "records", header_record(probe_template(r)))
    writer.write(record)
    return writer, rollout, record


def test_the_loop_computes_assistants_and_turns_once_and_the_report_shows_those_turns(written, renderer_for):
    _, rollout, record = written
    assert rollout.assistants == (1, 3)  # user, assistant (call 0), tool, assistant (call 1)
    starts = [c.output_start for c in rollout.calls]
    assert rollout.turn_of[: starts[1]] == (0,) * starts[1] and set(rollout.turn_of[starts[1] :]) == {1}
    tokens = [item for item in token_view(record, renderer_for("qwen3").decode) if isinstance(item, Token)]
    assert tokens and all(
        tok.turn == (record.turn_of[tok.position] if tok.position >= starts[0] else -1) for tok in tokens
    )
    assert {tok.turn for tok in tokens} == {-1, 0, 1}


def test_every_line_carries_the_schema_version_and_old_files_still_load(written, tmp_path):
    writer, rollout, record = written
    header, line = (json.loads(x) for x in writer.path.read_text().splitlines())
    assert header["version"] == line["version"] == SCHEMA_VERSION
    # A file from before the version (and turn_of) was written: it loads, and turn_of is recomputed the same.
    old = {k: v for k, v in line.items() if k not in ("version", "turn_of")}
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps(old) + "\n")
    (loaded,) = read_records([path])[1]
    assert loaded.version == 1 and loaded.turn_of == rollout.turn_of
    assert dataclasses.replace(loaded, version=SCHEMA_VERSION) == record


def test_a_newer_schema_version_is_refused_with_the_fix(written, tmp_path):
    writer, _, _ = written
    header, line = writer.path.read_text().splitlines()
    path = tmp_path / "new.jsonl"
    path.write_text(header + "\n" + json.dumps({**json.loads(line), "version": SCHEMA_VERSION + 1}) + "\n")
    with pytest.raises(RecordError, match=rf"{path}:2: record schema version {SCHEMA_VERSION + 1} is newer.*upgrade"):
        read_records([path])
    path.write_text(json.dumps({**json.loads(header), "version": SCHEMA_VERSION + 1}) + "\n" + line + "\n")
    with pytest.raises(RecordError, match=rf"{path}:1: record schema version {SCHEMA_VERSION + 1} is newer"):
        read_records([path])


def test_non_finite_logprobs_are_written_as_strict_json_and_read_back(renderer_for, written, tokenizer_dirs, capsys):
    writer, rollout, _ = written
    r = renderer_for("qwen3")
    first, second = rollout.calls
    bad = second.replace(logprobs=(math.nan, -math.inf, *second.logprobs[2:]))
    nan_rollout = dataclasses.replace(rollout, calls=(first, bad))
    result = ConsistencyChecker(r).check_rollout(nan_rollout)
    assert {f.kind for f in result.engine_failures} >= {FailureKind.LOGPROB_NOT_FINITE}
    writer.write(nan_rollout.record(result))

    line = writer.path.read_text().splitlines()[-1]
    obj = _strict(line)  # no bare NaN: any JSON reader takes it
    assert obj["engine_calls"][1]["logprobs"][:2] == ["NaN", "-Infinity"]
    loaded = read_records([writer.path])[1][-1]
    got = loaded.engine_calls[1].logprobs
    assert math.isnan(got[0]) and got[1] == -math.inf and got[2:] == second.logprobs[2:]
    assert math.isnan(loaded.logprobs[3][0])  # the replay part (assistant message 3) too
    assert math.isnan(loaded.replay_record().logprobs[3][0])
    # verl-ext replay reads the file: the NaN turn is rejected as engine output (exit 1), not a parse error (2)
    assert cli(["replay", str(writer.path), "--tokenizer", str(tokenizer_dirs["qwen3"])]) == 1
    assert "engine output: REJECTED" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda o: o.update(step="7"), "'step' must be an integer, got a string"),
        (lambda o: o["check"]["findings"][0].update(turn="1"), "'check.findings[0].turn' must be an integer"),
        (lambda o: o["engine_calls"][0].update(output_ids=[1, "2"]), "'engine_calls[0].output_ids[1]' must be"),
        (lambda o: o["check"].update(ok="yes"), "'check.ok' must be true or false"),
        (lambda o: o.update(check=[]), "no 'check' object"),
        (lambda o: o["logprobs"].update({"1": ["x"]}), "'logprobs.1[0]' must be a number"),
        (lambda o: o["engine_calls"][1].update(logprobs=[[0.1]]), "'engine_calls[1].logprobs[0]' must be a number"),
        (lambda o: o.update(version="2"), "'version' must be an integer"),
    ],
)
def test_report_type_checks_record_fields_in_one_line_with_exit_2(written, tokenizer_dirs, tmp_path, capsys, edit, key):
    writer, _, _ = written
    header, line = writer.path.read_text().splitlines()
    obj = json.loads(line)
    edit(obj)
    path = tmp_path / "edited.jsonl"
    path.write_text(header + "\n" + json.dumps(obj) + "\n")
    out = tmp_path / "report.html"
    assert cli(["report", str(path), "-o", str(out), "--tokenizer", str(tokenizer_dirs["qwen3"])]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"verl-ext report: error: {path}:2: ") and key in err
    assert err.count("\n") == 1 and "Traceback" not in err and not out.exists()


def test_the_record_round_trips_through_its_json_and_replays_as_the_replay_format(written):
    _, _, record = written
    assert RolloutRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
    replayed = record.replay_record()
    assert replayed.sampled == {i: c.output_ids for i, c in zip((1, 3), record.engine_calls, strict=True)}


def test_check_result_to_dict_is_the_record_lines_check_object_and_every_result_field_is_recorded(
    written, renderer_for
):
    from verl_ext.check import CheckResult, EngineFailure, Finding
    from verl_ext.check.record import RecordedCheck, RecordedFailure, RecordedFinding

    _, rollout, _ = written
    result = ConsistencyChecker(renderer_for("qwen3")).check_rollout(rollout)
    assert result.findings and RecordedCheck.of(result).to_json() == rollout.record(result).to_json()["check"]
    failed = dataclasses.replace(result, engine_failures=(EngineFailure(FailureKind.RECORD, 1, None, "x"),))
    assert RecordedCheck.of(failed).to_json()["engine_failures"] == [
        {"kind": "record", "turn": 1, "position": None, "detail": "x"}
    ]

    # the record's JSON keys are its fields, in order: the result's, under the same names
    def names(cls: type) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    assert names(RecordedCheck) == ["ok", "engine_ok", *names(CheckResult)]
    assert names(RecordedFinding) == names(Finding) and names(RecordedFailure) == names(EngineFailure)
    assert list(RecordedCheck.of(result).to_json()) == names(RecordedCheck)

    @dataclasses.dataclass(frozen=True)
    class NewerResult(CheckResult):
        a_new_field: int = 0

    with pytest.raises(TypeError, match="a_new_field"):  # not silently left out of the records
        RecordedCheck.of(NewerResult(**{f.name: getattr(result, f.name) for f in dataclasses.fields(result)}))


def test_the_replay_format_reads_the_strings_records_write_for_non_finite_floats():
    from verl_ext.core.replay import ReplayRecord

    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    record = ReplayRecord.from_json({"messages": messages, "sampled": {"1": [1, 2]}, "logprobs": {"1": ["NaN", -1]}})
    assert math.isnan(record.logprobs[1][0]) and record.logprobs[1][1] == -1.0
    for bad in (["nan", -1], [[0.1], -1]):
        with pytest.raises(RecordError, match=r"'logprobs'\['1'\] is invalid: item 0 .* not a number"):
            ReplayRecord.from_json({"messages": messages, "sampled": {"1": [1, 2]}, "logprobs": {"1": bad}})


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda p: p.update(verdict=1), "'template_profile.verdict' must be a string"),
        (lambda p: p["boundaries"][0].update(close_ids="x"), "'template_profile.boundaries[0].close_ids' must be"),
        (lambda p: p["stop_ids"][0].update(id="1"), "'template_profile.stop_ids[0].id' must be an integer"),
        (lambda p: p.update(strips_reasoning="no"), "'template_profile.strips_reasoning' must be true or false"),
        (lambda p: p.update(unsupported_roles={"tool": 3}), "'template_profile.unsupported_roles.tool' must be"),
    ],
)
def test_the_header_profile_is_type_checked_in_one_line_with_exit_2(
    written, tokenizer_dirs, tmp_path, capsys, edit, key
):
    writer, _, _ = written
    header, line = writer.path.read_text().splitlines()
    obj = json.loads(header)
    edit(obj["template_profile"])
    path = tmp_path / "edited.jsonl"
    path.write_text(json.dumps(obj) + "\n" + line + "\n")
    out = tmp_path / "report.html"
    assert cli(["report", str(path), "-o", str(out), "--tokenizer", str(tokenizer_dirs["qwen3"])]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"verl-ext report: error: {path}:1: ") and key in err
    assert err.count("\n") == 1 and "Traceback" not in err and not out.exists()


def test_the_header_profile_is_typed_and_an_old_partial_profile_still_loads(written, renderer_for, tmp_path):
    writer, _, _ = written
    profile = probe_template(renderer_for("qwen3"))
    (header,) = read_records([writer.path])[0]
    typed = header.profile
    assert typed == header_record(profile).profile  # the writer's header and the file's read back the same
    assert typed.fingerprint == profile.fingerprint and typed.verdict == profile.verdict.value
    assert [b.close_ids for b in typed.boundaries] == [b.close_ids for b in profile.boundaries]
    assert typed.alias_stop_ids == tuple(sorted(profile.alias_id_set))
    # A header from before the version and the newer profile keys: it loads, missing keys take their defaults.
    raw = json.loads(writer.path.read_text().splitlines()[0])
    old = {k: raw["template_profile"][k] for k in ("fingerprint", "verdict", "boundaries")}
    path = tmp_path / "old.jsonl"
    path.write_text(json.dumps({"type": "header", "template_profile": old}) + "\n")
    (loaded,) = read_records([path])[0]
    assert loaded.version == 1 and loaded.profile.boundaries == typed.boundaries
    assert loaded.profile.stop_ids == () and loaded.profile.strips_reasoning is None
    assert loaded.profile.tool_call_arguments == "?"


def test_a_rollout_with_fewer_kinds_than_stream_tokens_is_a_trajectory_error(written):
    _, rollout, _ = written
    short = rollout.kinds[: len(rollout.sample.stream) - 1]
    with pytest.raises(TrajectoryError, match=r"kinds for a stream of \d+ tokens; pass one per token"):
        Rollout.of(rollout.calls, rollout.sample, rollout.messages, rollout.tools, kinds=short)
