"""The report's fix texts are chosen by the loop that wrote each record: verl's stock loop (audited) is told to switch
to verl_ext's loop; a record verl_ext's own loop wrote never is (there a token defect is verl_ext's bug, to report with
the record). The loop is read from the record: its ``loop`` key, else what each loop writes (verl_ext_tool_agent its
row's data_source and index, the gateway its ``gateway`` key, with ``trains`` where a trainer took the branch)."""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path
from typing import Any

import pytest
from test_report_html import report_of, section, text_of

from verl_ext.check.findings import Cause, FailureKind
from verl_ext.report.fixes import CAUSE_FIXES, ENGINE_FIXES, cause_fix, engine_fix
from verl_ext.report.loops import Loop, loop_of

# what sends a user to verl_ext's loop: the switch, the option that makes it, "as verl_ext_tool_agent does"
SWITCH = re.compile(r"[Ss]witch the loop|default_agent_loop=|verl_ext_tool_agent does")
NAMES = [("cause", c.value) for c in Cause] + [("kind", k.value) for k in FailureKind] + [("cause", "from_newer")]


def fix(which: str, name: str, loop: Loop) -> str:
    return cause_fix(name, loop) if which == "cause" else engine_fix(name, loop)


def test_no_fix_sends_verl_exts_own_loop_to_itself() -> None:
    for (which, name), loop in itertools.product(NAMES, Loop):
        text = fix(which, name, loop)
        stock = fix(which, name, Loop.UNKNOWN)
        assert text.strip() and "\n" not in text
        if loop.builds_tokens:
            assert not SWITCH.search(text), f"{which} {name} on {loop.value}'s records: {text}"
            assert text == stock or "verl_ext bug" in text  # only a line that named the switch changes
        else:  # verl's stock loop (and a record no loop names): the switch is the fix
            assert text == stock, (which, name, loop)


def test_the_stock_loops_switch_lines_change_and_only_they() -> None:
    stock = {**{("cause", k): v for k, v in CAUSE_FIXES.items()}, **{("kind", k): v for k, v in ENGINE_FIXES.items()}}
    switching = {key for key, text in stock.items() if SWITCH.search(text)}
    assert {("cause", "boundary_missing"), ("cause", "close_missing"), ("kind", "mask")} <= switching
    changed = {key for key in stock if fix(*key, Loop.TOOL_AGENT) != stock[key]}
    assert changed == switching
    # a setting of verl_ext's loop stays the fix where it is one; the bug report follows
    assert "verl_ext.extra_stop_tokens" in cause_fix("close_missing", Loop.TOOL_AGENT)
    assert "verl_ext.escape_special_tokens=true" in cause_fix("special_token_injected", Loop.GATEWAY_AGENT)
    assert "extra_stop_tokens" not in cause_fix("close_missing", Loop.GATEWAY)  # the CLI gateway has no such option


def _stamped(record: Any, **extra: Any) -> Any:
    return dataclasses.replace(record, extra={**record.extra, **extra})


def test_the_loop_is_read_from_what_each_loop_writes(all_records: list[Any]) -> None:
    record = all_records[0]
    assert loop_of(record) is Loop.UNKNOWN  # built by the test's own loop: no key a loop writes
    assert loop_of(_stamped(record, data_source="gsm8k", index=3)) is Loop.TOOL_AGENT  # verl_ext_tool_agent's keys
    for loop in Loop:
        assert loop_of(_stamped(record, loop=loop.value)) is loop  # the record's own word wins
    assert loop_of(_stamped(record, loop="a_newer_loop")) is Loop.UNKNOWN


def test_gateway_records_name_their_loop(gateway_records: Path, standalone_records: Path) -> None:
    from verl_ext.report.load import load_records

    trained = {r.label: loop_of(r.record) for r in load_records([gateway_records]).rollouts}
    assert trained == {
        **{f"session edits · branch {b}": Loop.GATEWAY_AGENT for b in range(3)},
        "session plain · branch 0": Loop.GATEWAY,  # ended without a trainer's decision
    }
    assert {loop_of(r.record) for r in load_records([standalone_records]).rollouts} == {Loop.GATEWAY}


@pytest.fixture(scope="module")
def own_loop_page(all_records: list[Any], tmp_path_factory: pytest.TempPathFactory, tokenizer_dirs: Any) -> str:
    """The report's records as verl_ext_tool_agent writes them (its row's data_source and index)."""
    records = [_stamped(r, data_source="gsm8k", index=k) for k, r in enumerate(all_records)]
    return report_of(records, tmp_path_factory.mktemp("own"), tokenizer_dirs["qwen3"])


def test_verl_exts_own_records_are_never_told_to_switch_to_its_loop(own_loop_page: str, built_report: Any) -> None:
    stock = built_report.html
    for name in ("verdict", "fixes", "examples"):
        assert SWITCH.search(text_of(section(stock, name))), name  # the stock records are told to switch
        own = text_of(section(own_loop_page, name))
        assert not SWITCH.search(own), (name, SWITCH.search(own))
    verdict = text_of(section(own_loop_page, "verdict"))
    assert "boundary_missing: 1 defect" in verdict and "verl_ext's own loop (verl_ext_tool_agent)" in verdict
    assert "verl_ext.escape_special_tokens=true" in verdict  # special_token_injected: the setting is still named


def test_a_page_of_both_loops_says_each_loops_fix(all_records: list[Any], tmp_path: Path, tokenizer_dirs: Any) -> None:
    naive = [r for r in all_records if any(f.cause == "boundary_missing" for f in r.check.findings)]
    assert len(naive) == 1
    records = [naive[0], _stamped(naive[0], loop=Loop.TOOL_AGENT.value)]
    page = report_of(records, tmp_path, tokenizer_dirs["qwen3"])
    fixes = section(page, "fixes")
    row = text_of(re.search(r'<tr id="fix-boundary_missing".*?</tr>', fixes, re.DOTALL).group(0))
    assert "On other loops' records: Switch the loop to verl_ext" in row
    assert "On verl_ext_tool_agent's records: verl_ext's own loop (verl_ext_tool_agent) built these tokens" in row
    # each shown rollout's findings get its own loop's fix
    examples = section(page, "examples").split('<div class="example"')[1:]
    todo = [text_of(e) for e in examples if "boundary_missing" in e]
    assert len(todo) == 2 and sum("Switch the loop" in t for t in todo) == 1
    assert sum("verl_ext's own loop (verl_ext_tool_agent)" in t for t in todo) == 1
