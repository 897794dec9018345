"""The report's numerics section, built by the CLI from real Qwen3 rollout records and numerics lines in the
driver's own file: |Δ| by depth and turn as plots, the rollouts that drift most with turn and position and a link
to their token view (drifting tokens coloured), the two-part verdict in the rollout list; older records and files
without numerics lines say the view is absent and why."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from numerics_rollouts import numerics_of_record
from report_rollouts import build_records
from test_report_html import section, text_of

from verl_ext.cli.main import main
from verl_ext.core.numerics import NumericsOptions
from verl_ext.core.probe import probe_template
from verl_ext.telemetry.records import RecordWriter, header_record, numerics_record

OPTIONS = NumericsOptions(depth_edges=(0, 64, 128, 256))


@pytest.fixture(scope="module")
def run(renderer_for, tmp_path_factory):
    """(folder, rollouts file, numerics file, records, the two drifting rollouts' indexes and where each starts)."""
    r = renderer_for("qwen3")
    folder = tmp_path_factory.mktemp("numerics-run")
    records = build_records(r)
    loop = RecordWriter(folder, header_record(probe_template(r)), prefix="rollouts")
    for record in records:
        loop.write(record)
    driver = RecordWriter(folder, prefix="numerics")
    clean = [k for k, rec in enumerate(records) if rec.check.ok and len(rec.engine_calls) == 2]
    by_turn, by_depth = clean[0], clean[1]
    # One rollout drifts in its second turn only; another from a depth on (both far past the thresholds).
    depth_from = records[by_depth].engine_calls[1].output_start + 2
    starts = {
        by_turn: records[by_turn].engine_calls[1].output_start,
        by_depth: depth_from,
    }
    for k, rec in enumerate(records):
        if k == by_turn:
            shift = lambda p, t: -0.9 if t == 1 else 1e-7  # noqa: E731
        elif k == by_depth:
            shift = lambda p, t: 0.8 if p >= depth_from else 1e-7  # noqa: E731
        else:
            shift = lambda p, t: 1e-7 * (1 + p % 3)  # noqa: E731
        driver.write(numerics_record(numerics_of_record(rec, shift, OPTIONS), OPTIONS))
    return folder, loop.path, driver.path, records, starts


def report(tmp_path: Path, tokenizer_dirs, *files: Path) -> str:
    out = tmp_path / "report.html"
    args = ["report", *map(str, files), "-o", str(out), "--tokenizer", str(tokenizer_dirs["qwen3"])]
    assert main(args) == 0
    return out.read_text(encoding="utf-8")


def test_the_section_plots_by_depth_and_turn_and_names_where_drift_starts(run, tokenizer_dirs, tmp_path):
    _, rollouts, numerics, records, starts = run
    html = report(tmp_path, tokenizer_dirs, rollouts, numerics)
    nm = section(html, "numerics")
    assert "Numerics view absent" not in nm
    svg = nm[nm.index("<svg") :]
    for title in ("mean |Δ| by context depth", "mean |Δ| by turn", "mean |Δ| per training step", "drift threshold"):
        assert title in svg
    assert "difference of probabilities" in text_of(nm)
    rows = re.findall(r"<tr><td class=\"nowrap\">(.*?)</tr>", nm, re.DOTALL)
    assert len(rows) == 2  # exactly the two drifting rollouts, worst first
    labels = {}
    for row in rows:
        link = re.search(r'<a href="#(example-\d+)">([^<]+)</a>', row)
        assert link, row  # each links to its token view
        labels[link.group(2)] = (link.group(1), text_of(row))
    for k, start in starts.items():
        label = f"{rollouts.name} #{k + 1}"
        anchor, text = labels[label]
        rec = records[k]
        assert f"turn {rec.turn_of[start]}" in text and f"position {start}" in text, text
        assert f"depth {OPTIONS.depth_edges[[e <= start for e in OPTIONS.depth_edges].count(True) - 1]}" in text
        # its token view: the drift mark at the start, drifting tokens coloured, and none of them before the start
        example = re.search(rf'<div class="example" id="{anchor}">(.*?)(?=<div class="example"|</section>)', html, re.S)
        assert example, anchor
        body = example.group(1)
        assert f'id="{anchor}-mD"' in body and f'id="{anchor}-finding-D"' in body
        # the drifting turn's tokens (turn 1 drifts in both rollouts, and its depth buckets), never turn 0's
        drift = [int(p) for p in re.findall(r'class="t sampled[^"]* drift" title="position (\d+)', body)]
        assert drift and min(drift) == rec.engine_calls[1].output_start, (start, drift[:5])
        assert {rec.turn_of[p] for p in drift} == {1}


def test_the_rollout_list_shows_the_two_part_verdict(run, tokenizer_dirs, tmp_path):
    _, rollouts, numerics, records, starts = run
    html = report(tmp_path, tokenizer_dirs, rollouts, numerics)
    listing = section(html, "rollouts")
    assert "<th>numbers</th>" in listing
    badges = re.findall(r'<span class="badge st-([a-z-]+)" title="tokens (\w+) · numbers ([^"(]+)', listing)
    numbers = [n.strip() for _, _, n in badges]
    assert len(badges) == len(records)
    assert numbers.count("drift") == 2
    engine_failed = sum(not r.check.engine_ok for r in records)
    assert numbers.count("not compared") == engine_failed == 1  # the tokens are not the engine's: not compared
    assert numbers.count("ok") == len(records) - 3
    assert '<option value="numbers_drift">numbers drift (2)</option>' in listing
    verdict = text_of(section(html, "verdict"))
    assert "numbers: 2 rollouts of 11 measured drift" in verdict


def test_older_records_say_the_view_is_absent_and_why(run, tokenizer_dirs, tmp_path):
    _, rollouts, numerics, _, _ = run
    old = tmp_path / "v5.jsonl"
    lines = [json.loads(x) for x in rollouts.read_text().splitlines()]
    old.write_text("".join(json.dumps({**x, "version": 5}) + "\n" for x in lines))
    html = report(tmp_path, tokenizer_dirs, old)
    nm = text_of(section(html, "numerics"))
    assert "Numerics view absent. These records are of schema version 5, written before verl_ext had the numerics" in nm
    assert "<th>numbers</th>" not in section(html, "rollouts")


def test_current_records_without_the_drivers_file_say_which_file_to_pass(run, tokenizer_dirs, tmp_path):
    _, rollouts, _, _, _ = run
    nm = text_of(section(report(tmp_path, tokenizer_dirs, rollouts), "numerics"))
    assert "These files hold no numerics lines" in nm and "pass every file of that folder" in nm


def test_a_clean_run_shows_the_baseline_and_no_drift(renderer_for, tokenizer_dirs, tmp_path):
    r = renderer_for("qwen3")
    records = [rec for rec in build_records(r) if rec.check.engine_ok]
    loop = RecordWriter(tmp_path / "clean", header_record(probe_template(r)), prefix="rollouts")
    driver = RecordWriter(tmp_path / "clean", prefix="numerics")
    for rec in records:
        loop.write(rec)
        driver.write(numerics_record(numerics_of_record(rec, lambda p, t: 1e-11, OPTIONS), OPTIONS))
    html = report(tmp_path, tokenizer_dirs, loop.path, driver.path)
    nm = section(html, "numerics")
    assert "No rollout&#39;s numbers drift" in nm or "No rollout's numbers drift" in nm
    assert "<svg" in nm
    assert "numbers:" not in text_of(section(html, "verdict"))
