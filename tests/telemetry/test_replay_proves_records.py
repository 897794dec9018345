"""Replay proves what was trained: it compares the rebuilt stream with a record's ``input_ids`` and loss mask, and its
tokenizer with the header's fingerprint; record keys it does not know and newer versions are refused; report and
replay re-validate stored engine calls instead of trusting the stored verdict."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
from rollouts import TOOLS
from template_fixtures import template_renderer
from test_metrics_and_records import two_turn_rollout

from verl_ext.check import ConsistencyChecker
from verl_ext.check.inputs import engine_calls_from_trajectory, trainer_sample_from_trajectory
from verl_ext.check.record import Rollout
from verl_ext.cli.main import main as cli
from verl_ext.core.probe import probe_template
from verl_ext.core.replay import ReplayRecord, replay
from verl_ext.telemetry.records import RecordWriter, header_record

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "replay" / "qwen3_tool_call.jsonl"
DIFFERS = "REPLAY DIFFERS FROM THE RECORD: "


@pytest.fixture
def record_file(renderer_for, tmp_path) -> Path:
    """A check's record file (header + one clean two-turn Qwen3 rollout, as verl_ext's loop builds it)."""
    r = renderer_for("qwen3")
    ro = two_turn_rollout(r, stop_on_tool_call=True)
    rollout = Rollout.of(
        ro.calls, ro.sample(), ro.messages, TOOLS, step=1, kinds=[k.value for k in ro.trajectory.kinds]
    )
    writer = RecordWriter(tmp_path / "records", header_record(probe_template(r)))
    writer.write(rollout.record(ConsistencyChecker(r).check_rollout(rollout)))
    return writer.path


def edited(path: Path, tmp_path: Path, edit, line: int = 1) -> Path:
    """A copy of the record file with ``edit`` applied to the JSON object of line ``line`` (0: the header)."""
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    edit(lines[line])
    out = tmp_path / "edited.jsonl"
    out.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return out


def test_a_record_that_replays_to_what_was_trained_says_so(record_file, tokenizer_dirs, capsys):
    assert cli(["replay", str(record_file), "--tokenizer", str(tokenizer_dirs["qwen3"])]) == 0
    out = capsys.readouterr().out
    n = len(json.loads(record_file.read_text().splitlines()[1])["input_ids"])
    assert f"recorded stream: the same {n} tokens and loss mask" in out and DIFFERS not in out
    assert cli(["replay", str(record_file), "--tokenizer", str(tokenizer_dirs["qwen3"]), "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    assert result["ok"] and result["recorded"] == {"same": True, "differences": [], "engine_failures": []}


def test_the_wrong_tokenizer_is_the_first_line_and_exit_1(record_file, tokenizer_dirs, capsys):
    # Qwen2.5 shares most of Qwen3's vocabulary: the replay builds a plausible stream whose invariants all hold
    assert cli(["replay", str(record_file), "--tokenizer", str(tokenizer_dirs["qwen2.5"])]) == 1
    first, *rest = capsys.readouterr().out.split("\n\n")[0].splitlines()
    assert first.startswith(DIFFERS + f"{record_file}: the records were written with tokenizer ")
    assert "fingerprint" in first and "Replay with the tokenizer folder" in first
    # then what the other tokenizer does to the record: ids past its vocabulary rejected, another stream; but no
    # engine-view failure of the stored calls is invented from its vocabulary
    differs = f"  also: {record_file}:2: the replayed stream differs from the recorded input_ids"
    assert any(line.startswith(differs) for line in rest)
    assert not [line for line in rest if "engine view failure" in line]
    assert cli(["replay", str(record_file), "--tokenizer", str(tokenizer_dirs["qwen2.5"]), "--json"]) == 1
    captured = capsys.readouterr()
    (result,) = json.loads(captured.out)
    assert not result["ok"] and not result["recorded"]["same"] and captured.err.startswith("verl-ext replay: ")


def test_a_changed_stream_is_named_by_position_and_text(record_file, tokenizer_dirs, tmp_path, capsys):
    def change(obj):
        obj["input_ids"][5] = 1000  # what was trained is not what the record's conversation rebuilds

    path = edited(record_file, tmp_path, change)
    assert cli(["replay", str(path), "--tokenizer", str(tokenizer_dirs["qwen3"])]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(DIFFERS + f"{path}:2: the replayed stream differs from the recorded input_ids at token 5 ")
    assert "ids [1000" in first


@pytest.fixture
def fixed_today(monkeypatch):
    """``set(day)``: the date transformers' ``strftime_now`` renders from then on, and the clock verl_ext pins a
    rollout's renders to (``ChatRenderer.pinned``)."""
    from transformers.utils import chat_template_utils

    from verl_ext.core import rendering

    def set_day(day: int) -> None:
        class Day(datetime.datetime):
            @classmethod
            def now(cls, tz=None):
                return datetime.datetime(2026, 11, day, 12, 0, 0)

        monkeypatch.setattr(chat_template_utils, "datetime", Day)
        monkeypatch.setattr(rendering.datetime, "datetime", Day)

    return set_day


def test_a_template_that_stamps_today_replayed_another_day_is_named(fixed_today, tmp_path, capsys):
    # Llama 3.2's template writes "Today Date: 25 Nov 2026" into the system prompt from strftime_now
    r = template_renderer("meta-llama-Llama-3.2-3B-Instruct")
    folder = tmp_path / "llama-like"
    r.tokenizer.chat_template = r.chat_template
    r.tokenizer.save_pretrained(folder)
    messages = [{"role": "user", "content": "What is 1+1?"}, {"role": "assistant", "content": "2."}]
    fixed_today(25)
    t = replay(r, ReplayRecord.from_json({"messages": messages}))
    assert "25 Nov 2026" in r.decode(t.input_ids)
    rollout = Rollout.of(
        engine_calls_from_trajectory(t), trainer_sample_from_trajectory(t), t.messages, kinds=[k.value for k in t.kinds]
    )
    writer = RecordWriter(tmp_path / "records", header_record(probe_template(r)))
    writer.write(rollout.record(ConsistencyChecker(r).check_rollout(rollout)))

    fixed_today(26)  # the next day
    assert cli(["replay", str(writer.path), "--tokenizer", str(folder)]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(DIFFERS + f"{writer.path}:2: the replayed stream differs from the recorded input_ids")
    recorded, replayed = first.split("the record has ")[1].split(", the replay ")
    assert "Today Date: 2" in first and recorded.startswith("'5 Nov 2026") and replayed.startswith("'6 Nov 2026")
    assert "renders today's date (strftime_now)" in first
    fixed_today(25)  # the day it was recorded: the same stream
    assert cli(["replay", str(writer.path), "--tokenizer", str(folder)]) == 0


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("sampeld", "unknown key 'sampeld' (did you mean 'sampled'?) in a replay record"),
        ("logprob", "unknown key 'logprob' (did you mean 'logprobs'?)"),
        ("type", "\"type\" 'rolout' is not a record type"),
    ],
)
def test_an_unknown_replay_key_is_refused_with_the_key_and_the_fix(key, message, tokenizer_dirs, tmp_path, capsys):
    obj = json.loads(EXAMPLE.read_text().splitlines()[0])
    obj[key] = {"4": [16, 17, 9, 22, 284, 220, 23, 19, 13, 151645]} if key != "type" else "rolout"
    path = tmp_path / "typo.jsonl"
    path.write_text(json.dumps(obj) + "\n")
    assert cli(["replay", str(path), "--tokenizer", str(tokenizer_dirs["qwen3"])]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"verl-ext replay: error: {path}:1: ") and message in err
    assert err.count("\n") == 1 and ("Rename or remove it" in err or "remove it" in err)


def test_a_newer_version_in_a_replay_file_is_refused(tokenizer_dirs, tmp_path, capsys):
    obj = {**json.loads(EXAMPLE.read_text().splitlines()[0]), "version": 99}
    path = tmp_path / "new.jsonl"
    path.write_text(json.dumps(obj) + "\n")
    assert cli(["replay", str(path), "--tokenizer", str(tokenizer_dirs["qwen3"])]) == 2
    err = capsys.readouterr().err
    assert f"{path}:1: record schema version 99 is newer than this verl_ext reads" in err and "upgrade" in err


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda o: o.update(sampeld=o["sampled"]), "unknown key 'sampeld' (did you mean 'sampled'?) in a rollout"),
        (lambda o: o["engine_calls"][0].update(logprbs=[]), "unknown key 'engine_calls[0].logprbs'"),
        (lambda o: o["check"].update(engine_okay=True), "unknown key 'check.engine_okay' (did you mean"),
    ],
)
def test_an_unknown_record_key_is_refused_by_replay_and_report(
    edit, message, record_file, tokenizer_dirs, tmp_path, capsys
):
    path = edited(record_file, tmp_path, edit)
    assert cli(["replay", str(path), "--tokenizer", str(tokenizer_dirs["qwen3"])]) == 2
    assert message in capsys.readouterr().err
    out = tmp_path / "report.html"
    assert cli(["report", str(path), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"verl-ext report: error: {path}:2: ") and message in err and not out.exists()


def test_a_loop_cannot_write_an_extra_key_the_reader_would_refuse(renderer_for):
    r = renderer_for("qwen3")
    ro = two_turn_rollout(r)
    with pytest.raises(ValueError, match=r"extra keys \['idx'\] are not record keys"):
        Rollout.of(ro.calls, ro.sample(), ro.messages, TOOLS, extra={"idx": 3})


def test_nan_engine_logprobs_under_a_clean_stored_verdict_are_failures(record_file, tokenizer_dirs, tmp_path, capsys):
    def poison(obj):
        obj["engine_calls"][1]["logprobs"][0] = "NaN"  # the stored verdict still says engine_ok

    path = edited(record_file, tmp_path, poison)
    assert json.loads(path.read_text().splitlines()[1])["check"]["engine_ok"] is True
    out = tmp_path / "report.html"
    assert cli(["report", str(path), "-o", str(out)]) == 0
    summary = capsys.readouterr().out
    assert "0 engine-view failures" not in summary and "engine-view failures" in summary
    html = out.read_text(encoding="utf-8")
    assert "logprob_not_finite" in html and "re-validating the stored engine calls" in html
    assert cli(["replay", str(path), "--tokenizer", str(tokenizer_dirs["qwen3"])]) == 1
    text = capsys.readouterr().out
    assert "engine view (stored and re-validated): " in text and "[logprob_not_finite]" in text


FAILS = "REPLAY FAILS: "


def _answer(obj) -> tuple[str, int]:
    """The answer turn's message key and the stream position of its first sampled token."""
    return max(obj["sampled"], key=int), obj["engine_calls"][1]["prompt_length"]


def _nan_stored(obj):
    obj["engine_calls"][1]["logprobs"][0] = "NaN"


def _nan_replayed(obj):
    obj["logprobs"][_answer(obj)[0]][0] = "NaN"


def _mask_off(obj):
    obj["loss_mask"][_answer(obj)[1] + 2] = 0


def _mask_on(obj):
    obj["loss_mask"][_answer(obj)[1] - 1] = 1  # the generation prompt's last token: never sampled


@pytest.mark.parametrize(
    ("tamper", "names"),
    [
        (_nan_stored, "engine view failure [logprob_not_finite] at token {start} (turn 1): "),
        (_nan_replayed, "engine output rejected [logprob_not_finite] at token {start} (turn 1): "),
        (_mask_off, "engine view failure [mask] at token {off} (turn 1): "),
        (_mask_on, "engine view failure [mask] at token {on} (turn 0): "),  # the prompt's tokens: turn 0's
    ],
)
def test_a_tampered_record_names_the_failure_its_kind_and_token_first(
    tamper, names, record_file, tokenizer_dirs, tmp_path, capsys
):
    path = edited(record_file, tmp_path, tamper)
    start = _answer(json.loads(record_file.read_text().splitlines()[1]))[1]
    assert cli(["replay", str(path), "--tokenizer", str(tokenizer_dirs["qwen3"])]) == 1
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(FAILS + f"{path}:2: " + names.format(start=start, off=start + 2, on=start - 1)), first
    assert cli(["replay", str(path), "--tokenizer", str(tokenizer_dirs["qwen3"]), "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("verl-ext replay: " + first) and not json.loads(captured.out)[0]["ok"]


def test_a_stored_nan_under_an_untouched_stream_is_still_the_first_line(record_file, tokenizer_dirs, tmp_path, capsys):
    # the stream replays the same (the replay keys are clean); only the stored engine call holds the NaN
    path = edited(record_file, tmp_path, _nan_stored)
    assert cli(["replay", str(path), "--tokenizer", str(tokenizer_dirs["qwen3"])]) == 1
    out = capsys.readouterr().out
    assert out.startswith(FAILS) and "recorded stream: the same " in out and DIFFERS not in out


def test_report_refuses_another_models_tokenizer_as_replay_does(record_file, tokenizer_dirs, tmp_path, capsys):
    out = tmp_path / "report.html"
    qwen25, qwen3 = str(tokenizer_dirs["qwen2.5"]), str(tokenizer_dirs["qwen3"])
    # Qwen2.5's vocabulary lacks Qwen3's <think> ids: decoding with it would draw them as engine-view failures
    assert cli(["report", str(record_file), "-o", str(out), "--tokenizer", qwen25]) == 2
    err = capsys.readouterr().err
    assert err.startswith("verl-ext report: error: the records were written with tokenizer ") and err.count("\n") == 1
    assert "Pass --tokenizer the folder the rollouts used" in err and not out.exists()
    assert cli(["report", str(record_file), "-o", str(out), "--tokenizer", qwen3]) == 0 and out.is_file()
    capsys.readouterr()

    # a header from before the tokenizer's own fingerprint was written: compared as replay compares it
    old = edited(record_file, tmp_path, lambda h: h["template_profile"].pop("tokenizer_fingerprint"), line=0)
    out.unlink()
    assert cli(["report", str(old), "-o", str(out), "--tokenizer", qwen25]) == 2 and not out.exists()
    assert "--chat-template FILE" in capsys.readouterr().err
    assert cli(["report", str(old), "-o", str(out), "--tokenizer", qwen3]) == 0


def test_a_file_given_twice_is_read_once_with_a_word(record_file, tokenizer_dirs, tmp_path, capsys):
    out = tmp_path / "report.html"
    alias = tmp_path / "alias.jsonl"
    alias.symlink_to(record_file)
    assert cli(["report", str(record_file), str(record_file), str(alias), "-o", str(out)]) == 0
    captured = capsys.readouterr()
    assert ": 1 rollout at step 1, " in captured.out  # not 3 rollouts
    assert f"{str(record_file)!r} was given before; it is read once" in captured.err
    assert f"{str(alias)!r} was given before (as {str(record_file)!r})" in captured.err
    tok = ["--tokenizer", str(tokenizer_dirs["qwen3"])]
    assert cli(["replay", str(record_file), str(alias), *tok]) == 0
    captured = capsys.readouterr()
    assert captured.out.count("recorded stream: the same ") == 1 and "was given before" in captured.err


def test_replay_takes_the_files_a_multi_worker_run_writes(record_file, tokenizer_dirs, tmp_path, capsys):
    other = tmp_path / "rollouts-worker2.jsonl"
    other.write_text(record_file.read_text())
    tok = ["--tokenizer", str(tokenizer_dirs["qwen3"])]
    assert cli(["replay", str(record_file), str(other), *tok]) == 0
    out = capsys.readouterr().out
    assert f"== {record_file}:2: " in out and f"== {other}:2: " in out
    assert cli(["replay", str(record_file), str(other), *tok, "--json"]) == 0
    assert [(r["file"], r["line"]) for r in json.loads(capsys.readouterr().out)] == [
        (str(record_file), 2),
        (str(other), 2),
    ]
