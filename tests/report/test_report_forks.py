"""Forks in the report: a gateway session whose harness edits its history (a changed question, then a retried tool
result) and one that never forks, served by the gateway on the CPU engine (tiny random Qwen3, the real Qwen3
tokenizer, scripted turns), recorded, and rendered by ``verl-ext report``."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_report_html import section, text_of


@pytest.fixture(scope="module")
def forks_report(gateway_records: Path, renderer_for: Callable[[str], Any]) -> Any:
    """(the line `verl-ext report` prints after "wrote FILE: ", the page), built as the command builds them."""
    from verl_ext.report import build_report

    renderer = renderer_for("qwen3")
    report = build_report([gateway_records], renderer.decode, vocab_size=renderer.vocab_size)
    return report.summary.one_line(), report.html


def test_the_summary_counts_forks_and_gateway_sessions(forks_report: Any) -> None:
    line, html = forks_report
    assert line.startswith("4 rollouts at step 0, 0 engine-view failures"), line  # not "over 1 steps"
    assert '<div class="k">training step (step 0)</div>' in html  # not "1 training steps (0–0)"
    assert line.endswith("2 forks in 1 of 2 gateway sessions"), line
    assert "2forks in 1 of 2 gateway sessions (4 branches)" in text_of(section(html, "summary"))  # value, label
    assert '<a href="#forks">Forks</a>' in html


def test_each_branch_of_a_forked_session_names_its_parent_and_what_differed(forks_report: Any) -> None:
    forks = section(forks_report[1], "forks")
    assert "by the field that differed: content 2" in text_of(forks)
    assert "plain" not in forks  # a session that never forked is counted, not listed
    rows = [
        [text_of(cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.DOTALL)]
        for row in re.findall(r"<tr>(.*?)</tr>", forks, re.DOTALL)[1:]
    ]
    # branch, rollout, started as, what differed, turns kept, turns, trained, verdict
    first, question, tool_result = rows
    assert first[0] == "0" and first[2] == "the session's first request" and first[-1] == "ok"
    assert question[0] == "1" and question[2] == "fork of branch 0 at messages[1], content"
    assert question[3] == "content: 'What is 6*7?' -> 'What is 6*7? Show your work.'"
    assert question[4] == "0"  # the edit is in the first prompt: nothing of the parent is kept
    assert tool_result[0] == "2" and tool_result[2] == "fork of branch 0 at messages[3], content"
    assert tool_result[3] == "content: '42' -> '41'" and tool_result[4] == "1"  # the calculator call is kept
    assert [r[-1] for r in rows] == ["ok", "ok", "ok"]
    # branch 2 replayed branch 0's calculator call: it trains it, branch 0 only its answer
    assert re.fullmatch(r"turn 1 \(\d+ tokens\); turn 0 in branch 2", first[6]), first[6]
    assert re.fullmatch(r"turn 0 \(\d+ tokens\)", question[6])
    assert re.fullmatch(r"turns 0, 1 \(\d+ tokens\)", tool_result[6])


def test_forked_rollouts_are_badged_and_filterable_in_the_list(forks_report: Any) -> None:
    listing = section(forks_report[1], "rollouts")
    badges = re.findall(r'<a class="badge fork" href="#session-1">([^<]*)</a>', listing)
    assert sorted(badges) == [
        "branch 1: fork of 0 at messages[1] (content)",
        "branch 2: fork of 0 at messages[3] (content)",
    ]
    assert '<option value="fork">fork (2)</option>' in listing


def test_records_of_other_loops_show_no_forks(built_report: Any) -> None:
    assert 'id="forks"' not in built_report.html and "gateway session" not in built_report.stdout


def test_a_malformed_fork_cause_is_an_error_naming_the_rollout_and_key(gateway_records: Path, tmp_path: Path) -> None:
    from verl_ext.core.replay import RecordError
    from verl_ext.report.forks import fork_counts
    from verl_ext.report.load import load_records

    lines = [json.loads(line) for line in gateway_records.read_text().splitlines()]
    for obj in lines:
        if obj.get("gateway", {}).get("fork"):
            obj["gateway"]["fork"]["parent"] = "0"  # a string where the gateway writes the branch number
    path = tmp_path / "broken.jsonl"
    path.write_text("".join(json.dumps(obj) + "\n" for obj in lines))
    records = load_records([path])  # the record reader passes the gateway key through; the report reads it
    with pytest.raises(RecordError, match=r"^broken.jsonl #2: gateway.fork.parent must be an integer, got a string;"):
        fork_counts(records.rollouts)


def test_a_malformed_trains_key_is_an_error_naming_the_rollout_and_key(gateway_records: Path, tmp_path: Path) -> None:
    from verl_ext.core.replay import RecordError
    from verl_ext.report.forks import fork_counts
    from verl_ext.report.load import load_records

    lines = [json.loads(line) for line in gateway_records.read_text().splitlines()]
    assert sum("trains" in obj.get("gateway", {}) for obj in lines) == 3  # the edited session's branches
    for obj in lines:
        if "trains" in obj.get("gateway", {}):
            obj["gateway"]["trains"]["turns"] = "0"
    path = tmp_path / "broken.jsonl"
    path.write_text("".join(json.dumps(obj) + "\n" for obj in lines))
    with pytest.raises(RecordError, match=r"^broken.jsonl #1: gateway.trains.turns must be a list of integers"):
        fork_counts(load_records([path]).rollouts)


@pytest.fixture(scope="module")
def standalone_page(standalone_records: Path, renderer_for: Callable[[str], Any]) -> Any:
    from verl_ext.report import build_report

    renderer = renderer_for("qwen3")
    report = build_report([standalone_records], renderer.decode, vocab_size=renderer.vocab_size)
    return report.summary.one_line(), report.html


def test_a_standalone_gateway_page_has_sessions_not_training_steps(standalone_page: Any) -> None:
    line, html = standalone_page
    assert line.startswith("4 rollouts from verl-ext gateway, 0 engine-view failures"), line
    summary = text_of(section(html, "summary"))
    assert "training step" not in summary and "2forks in 1 of 2 gateway sessions" in summary
    assert 'id="steps"' not in html and 'href="#steps"' not in html  # no plot of one point at step 0
    listing = section(html, "rollouts")
    assert 'id="filter-step"' not in listing and '<th class="num">step</th>' not in listing
    assert "· step" not in section(html, "examples")
    assert "verl_ext_tool_agent" not in text_of(section(html, "fixes"))  # the gateway built these tokens


def test_gateway_branches_are_named_by_their_session_id(forks_report: Any, standalone_page: Any) -> None:
    for _, html in (forks_report, standalone_page):
        listing = text_of(section(html, "rollouts"))
        names = re.findall(r"session (\w+) · branch (\d)", listing)
        assert sorted(names) == [("edits", "0"), ("edits", "1"), ("edits", "2"), ("plain", "0")], listing
        assert ".jsonl #" not in listing
        forks = section(html, "forks")
        assert [text_of(n) for n in re.findall(r'<td class="nowrap">(?:<a [^>]*>)?(session [^<]*)', forks)] == [
            f"session edits · branch {b}" for b in range(3)
        ]


def test_a_session_id_two_gateways_both_used_keeps_its_file(gateway_records: Path, standalone_records: Path) -> None:
    from verl_ext.report.load import load_records

    labels = [r.label for r in load_records([gateway_records, standalone_records]).rollouts]
    assert len(set(labels)) == len(labels) == 8
    assert f"session plain · branch 0 ({gateway_records} #4)" in labels
