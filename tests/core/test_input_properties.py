"""Random and mutated replay records through the real CLI: a correct result or a clear error (exit code 2, one
line, no traceback), never a silently accepted invalid token; an accepted record round-trips replay -> records ->
replay and report."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_ext.cli.main import main
from verl_ext.core.engine_output import POSITIVE_LOGPROB_TOLERANCE

VOCAB = 151669  # Qwen3
JSON_SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 10**9), st.floats(allow_nan=False), st.text(max_size=5)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3), max_leaves=5
)
IDS = st.lists(
    st.one_of(st.integers(0, 2000), st.just(151645), st.integers(-3, -1), st.integers(VOCAB, VOCAB + 5)), max_size=6
)
LOGPROB = st.one_of(st.floats(-20, 0), st.just(float("nan")), st.just(float("inf")), st.floats(0.5, 3))


@st.composite
def records(draw) -> dict[str, Any]:
    turns = draw(st.integers(1, 3))
    messages: list[dict[str, Any]] = [{"role": "user", "content": draw(st.text(max_size=8))}]
    sampled, logprobs, finish = {}, {}, {}
    for k in range(turns):
        messages.append({"role": "assistant", "content": draw(st.text(max_size=8))})
        index = str(len(messages) - 1)
        if draw(st.booleans()):
            ids = draw(IDS)
            sampled[index] = ids
            if draw(st.booleans()):
                logprobs[index] = [draw(LOGPROB) for _ in ids]
            finish[index] = draw(st.sampled_from(["stop", "length"]))
        if k < turns - 1:
            messages.append({"role": "user", "content": draw(st.text(max_size=8)) or "ok"})
    return {"messages": messages, "sampled": sampled, "logprobs": logprobs, "finish": finish}


@st.composite
def mutated(draw) -> Any:
    """A record with one value somewhere replaced by a random JSON value (or a key dropped)."""
    record = draw(records())
    paths: list[tuple[Any, ...]] = []

    def walk(node: Any, path: tuple[Any, ...]) -> None:
        paths.append(path)
        children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in children:
            walk(child, (*path, key))

    walk(record, ())
    path = draw(st.sampled_from(paths))
    if not path:
        return draw(JSON_VALUES)
    parent = record
    for key in path[:-1]:
        parent = parent[key]
    if isinstance(parent, dict) and draw(st.booleans()):
        del parent[path[-1]]
    else:
        parent[path[-1]] = draw(JSON_VALUES)
    return record


@pytest.fixture(scope="module")
def cli(tokenizer_dirs, monkeypatch_module):
    """``run(args) -> (code, out, err)`` over the real ``main``; the tokenizer folder is read once (not the point)."""
    from transformers import AutoTokenizer

    cache: dict[str, Any] = {}
    real = AutoTokenizer.from_pretrained

    def cached_from_pretrained(path: str, **kw: Any) -> Any:
        if path not in cache:
            cache[path] = real(path, **kw)
        return cache[path]

    # verl_ext imports transformers lazily, so the class itself is patched, not a name bound in verl_ext.
    monkeypatch_module.setattr(AutoTokenizer, "from_pretrained", cached_from_pretrained)
    return str(tokenizer_dirs["qwen3"])


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def assert_clear_error(code: int, err: str, command: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"verl-ext {command}: error: "), err
    assert "Traceback" not in err


def invalid(ids: list[int], logprobs: list[float] | None) -> bool:
    bad_ids = any(not 0 <= i < VOCAB for i in ids)
    bad_lps = logprobs is not None and any(not math.isfinite(x) or x > POSITIVE_LOGPROB_TOLERANCE for x in logprobs)
    return bad_ids or bad_lps


SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@SETTINGS
@given(record=records())
def test_random_records_replay_correctly_and_never_train_an_invalid_token(cli, capsys, tmp_path_factory, record):
    file = tmp_path_factory.mktemp("r") / "r.jsonl"
    file.write_text(json.dumps(record) + "\n")
    code, out, err = run(capsys, "replay", str(file), "--tokenizer", cli, "--json")
    if code == 2:
        assert_clear_error(code, err, "replay")
        return
    (result,) = json.loads(out)
    n = len(result["input_ids"])
    assert len(result["loss_mask"]) == len(result["logprobs"]) == len(result["kinds"]) == n
    assert all(0 <= i < VOCAB for i in result["input_ids"])
    assert all(math.isfinite(x) and x <= POSITIVE_LOGPROB_TOLERANCE for x in result["logprobs"])
    assert all((m == 1) == (k == "sampled") for m, k in zip(result["loss_mask"], result["kinds"], strict=True))
    bad = any(invalid(ids, record["logprobs"].get(k)) for k, ids in record["sampled"].items())
    assert bad == bool(result["output_problems"])  # an invalid engine output is never silently accepted ...
    assert code == (1 if bad or not result["ok"] else 0) and result["ok"] == (not bad and not result["failures"])


@SETTINGS
@given(record=mutated())
def test_mutated_records_give_a_result_or_one_clear_line(cli, capsys, tmp_path_factory, record):
    file = tmp_path_factory.mktemp("m") / "m.jsonl"
    file.write_text(json.dumps(record) + "\n")
    code, out, err = run(capsys, "replay", str(file), "--tokenizer", cli, "--json")
    if code == 2:
        assert_clear_error(code, err, "replay")
    else:
        assert code in (0, 1) and json.loads(out)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(data=st.binary(max_size=40), cut=st.integers(0, 200))
def test_damaged_files_give_one_clear_line(cli, capsys, tmp_path_factory, data, cut):
    folder = tmp_path_factory.mktemp("f")
    valid = json.dumps({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]})
    (folder / "bytes.jsonl").write_bytes(data)
    (folder / "cut.jsonl").write_text(valid + "\n" + valid[:cut])
    for name in ("bytes.jsonl", "cut.jsonl"):
        code, out, err = run(capsys, "replay", str(folder / name), "--tokenizer", cli, "--json")
        if code == 2:
            assert_clear_error(code, err, "replay")
        else:
            assert code in (0, 1) and json.loads(out)
    (folder / "t.jinja").write_bytes(data)
    code, out, err = run(capsys, "check-template", cli, "--chat-template", str(folder / "t.jinja"), "--json")
    if code == 2:
        assert_clear_error(code, err, "check-template")


def test_an_accepted_record_round_trips_through_records_and_report(cli, capsys, tmp_path):
    """replay -> the check's record -> replay again (same stream) and report (one page)."""
    from verl_ext.check import ConsistencyChecker
    from verl_ext.check.inputs import engine_calls_from_trajectory, trainer_sample_from_trajectory
    from verl_ext.check.record import Rollout
    from verl_ext.core.probe import probe_template
    from verl_ext.core.rendering import load_renderer
    from verl_ext.core.replay import ReplayRecord, replay
    from verl_ext.telemetry.records import RecordWriter, header_record

    example = Path(__file__).resolve().parents[2] / "examples" / "replay" / "qwen3_tool_call.jsonl"
    renderer = load_renderer(cli)
    writer = RecordWriter(tmp_path, header_record(probe_template(renderer)))
    streams = []
    for line in example.read_text().splitlines():
        record = ReplayRecord.from_json(json.loads(line))
        t = replay(renderer, record)
        checked = renderer.with_template_kwargs(record.chat_template_kwargs)
        calls = engine_calls_from_trajectory(t)
        rollout = Rollout.of(
            calls,
            trainer_sample_from_trajectory(t),
            t.messages,
            json.loads(line).get("tools"),
            chat_template_kwargs=record.chat_template_kwargs,
            kinds=[k.value for k in t.kinds],
        )
        result = ConsistencyChecker(checked).check_rollout(rollout)
        assert result.engine_ok
        writer.write(rollout.record(result))
        streams.append(t.input_ids)
    code, out, err = run(capsys, "replay", str(writer.path), "--tokenizer", cli, "--json")
    assert code == 0, err
    assert [r["input_ids"] for r in json.loads(out)] == streams
    html = tmp_path / "report.html"
    code, out, err = run(capsys, "report", str(writer.path), "-o", str(html), "--tokenizer", cli)
    assert code == 0, err
    assert html.stat().st_size > 0, "the report page is empty"
