"""Records schema 7: each engine call's attempts with their versions and the trained step round-trip through the
record file; lines of schemas 1 to 6 (no ``versions``) still load; a malformed ``versions`` is one clear error."""

from __future__ import annotations

import json

import pytest
from rollouts import TOOLS
from test_metrics_and_records import two_turn_rollout

from verl_ext.check import ConsistencyChecker
from verl_ext.check.record import SCHEMA_VERSION, Rollout
from verl_ext.core.probe import probe_template
from verl_ext.core.replay import RecordError
from verl_ext.core.version_spans import Attempt, RolloutVersions, VersionSpan, ids_crc, logprobs_crc
from verl_ext.telemetry.records import RecordWriter, header_record, read_records


def _versions(calls) -> RolloutVersions:
    """Each call one attempt on version 4, but the second: aborted after 2 ids, resumed on version 5."""
    rows = []
    for k, c in enumerate(calls):
        ids, lps = list(c.output_ids), list(c.logprobs or [])
        cuts = [0, 2, len(ids)] if k == 1 and len(ids) > 2 else [0, len(ids)]
        rows.append(
            tuple(
                Attempt(
                    4 + j,
                    a,
                    b,
                    4 + j,
                    0,
                    ids_crc(list(c.prompt_ids) + ids[:a]),
                    ids_crc(ids[a:b]),
                    logprobs_crc(lps[a:b]),
                )
                for j, (a, b) in enumerate(zip(cuts, cuts[1:], strict=False))
            )
        )
    return RolloutVersions(tuple(rows), trained_step=6)


@pytest.fixture
def written(renderer_for, tmp_path):
    r = renderer_for("qwen3")
    ro = two_turn_rollout(r, stop_on_tool_call=True)
    rollout = Rollout.of(ro.calls, ro.sample(), ro.messages, TOOLS, step=6, versions=_versions(ro.calls))
    result = ConsistencyChecker(r).check_rollout(rollout)
    writer = RecordWriter(tmp_path / "records", header_record(probe_template(r)))
    writer.write(rollout.record(result))
    return writer, rollout, result


def test_the_versions_round_trip_and_a_clean_resumed_rollout_checks_with_no_defect(written):
    writer, rollout, result = written
    assert result.ok, result.summary()
    _, (record,) = read_records([writer.path])
    assert record.version == SCHEMA_VERSION == 7
    assert record.versions == rollout.versions
    assert record.versions.served == [4, 5]
    from verl_ext.check.revalidate import revalidated

    assert revalidated(record, None) is record  # re-checked from the record alone: nothing the verdict missed
    assert record.versions.spans()[1] == [VersionSpan(4, 0, 2), VersionSpan(5, 2, len(rollout.calls[1].output_ids))]
    line = json.loads(writer.path.read_text().splitlines()[1])
    assert line["versions"]["trained_step"] == 6 and len(line["versions"]["calls"]) == 2


def test_a_tampered_record_is_caught_by_the_check_on_reload(written, renderer_for):
    """The record's rows are what the check re-reads: a version stamped after the update that stopped it shows."""
    _, rollout, _ = written
    a, b = rollout.versions.calls[1]
    bad = RolloutVersions((rollout.versions.calls[0], (Attempt(5, a.start, a.end, 4, 0, *a.to_list()[5:]), b)), 6)
    result = ConsistencyChecker(renderer_for("qwen3")).check_rollout(
        Rollout.of(rollout.calls, rollout.sample, rollout.messages, TOOLS, step=6, versions=bad)
    )
    assert {f.cause.value for f in result.defects} == {"version_stamped_on_return"}


@pytest.mark.parametrize("version", [None, 1, 2, 3, 4, 5, 6])
def test_lines_of_older_schemas_load_without_versions(written, tmp_path, version):
    writer, _, _ = written
    header, line = (json.loads(x) for x in writer.path.read_text().splitlines())
    del line["versions"]
    if version is None:
        del line["version"]
    else:
        line["version"] = header["version"] = version
    path = tmp_path / f"old{version}.jsonl"
    path.write_text(json.dumps(header) + "\n" + json.dumps(line) + "\n")
    _, (record,) = read_records([path])
    assert record.versions is None and record.version == (version or 1)


@pytest.mark.parametrize(
    "versions, message",
    [
        ({"calls": [[[4, 0]]]}, r"\[version, start, end"),
        ({"trained_step": "6", "calls": []}, "trained_step"),
        ({"calls": [[[4, 0, 2]]], "served": [4]}, "'versions' is an object"),
    ],
)
def test_a_malformed_versions_object_is_one_error_naming_the_line(written, tmp_path, versions, message):
    writer, _, _ = written
    header, line = writer.path.read_text().splitlines()
    path = tmp_path / "bad.jsonl"
    path.write_text(header + "\n" + json.dumps({**json.loads(line), "versions": versions}) + "\n")
    with pytest.raises(RecordError, match=rf"{path}:2: .*{message}"):
        read_records([path])


def test_the_report_draws_the_version_strips_and_the_staleness_plot(written, renderer_for):
    from verl_ext.report import build_report

    writer, _, _ = written
    r = renderer_for("qwen3")
    html = build_report([writer.path], r.decode, vocab_size=r.vocab_size).html
    assert 'id="versions"' in html and html.count('class="version-strip"') == 1
    assert "abort, resumed at token 2" in html and "staleness: versions between" in html


def test_the_report_rechecks_the_stored_versions_and_names_what_the_stored_verdict_missed(written, tmp_path):
    """A record whose rows were edited after its check (a version stamped late) reads clean on its stored verdict;
    re-validated, the version view's finding is added."""
    from verl_ext.check.revalidate import revalidated

    writer, _, _ = written
    header, line = writer.path.read_text().splitlines()
    obj = json.loads(line)
    obj["versions"]["calls"][1][0][0] = 9  # sent on 9, stopped on 4
    path = tmp_path / "edited.jsonl"
    path.write_text(header + "\n" + json.dumps(obj) + "\n")
    _, (record,) = read_records([path])
    assert record.check.ok
    again = revalidated(record, None)
    assert not again.check.ok
    (found,) = [f for f in again.check.findings if f.cause == "version_stamped_on_return"]
    assert found.turn == 1 and found.detail.startswith("found re-validating")
    assert revalidated(again, None) == again  # named now: nothing more is added
