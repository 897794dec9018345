"""The HTML report and the standalone audit page, built by the CLI from real Qwen3 rollout records."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from report_rollouts import HOSTILE
from rollouts import TOOLS

from verl_ext.check.findings import Cause
from verl_ext.cli.main import main

SECTIONS = ("verdict", "summary", "fixes", "steps", "turns", "numerics", "rollouts", "examples", "audit")
PRESENT = {  # causes the records hold (see report_rollouts.py)
    Cause.BPE_REMERGE,
    Cause.REASONING_INSERTED,
    Cause.EOS_ALIAS,
    Cause.SYNTHETIC_CLOSE,
    Cause.SPECIAL_TOKEN_ESCAPED,
    Cause.SPECIAL_TOKEN_INJECTED,
    Cause.BOUNDARY_MISSING,
    Cause.CLOSE_MISSING,
    Cause.CONTEXT_DIFFERS,  # the tool result the engine saw was "3", the messages say "2"
}


def section(html: str, name: str) -> str:
    match = re.search(rf'<section id="{name}">(.*?)</section>', html, re.DOTALL)
    assert match, f"no section {name!r}"
    return match.group(1)


def test_records_hold_what_the_report_should_show(records_file):
    lines = [json.loads(line) for line in records_file.read_text().splitlines()]
    assert lines[0]["type"] == "header" and all(r["type"] == "rollout" for r in lines[1:])
    checks = [r["check"] for r in lines[1:]]
    assert {f["cause"] for c in checks for f in c["findings"]} == {c.value for c in PRESENT}
    assert sum(not c["engine_ok"] for c in checks) == 1 and sum(c["truncated"] for c in checks) == 1
    assert {r["step"] for r in lines[1:]} == {0, 1, 2, 3}


def test_cli_prints_where_and_a_summary(built_report):
    assert built_report.stdout.strip() == (
        f"wrote {built_report.html_path}: 11 rollouts over 4 steps, 1 engine-view failure, "
        "5 rollouts with defects (45.5%), 12 findings"
    )


def test_without_tokenizer_the_folder_the_header_names_decodes(built_report, tmp_path, capsys):
    # every file the check writes has a header naming its tokenizer folder: no --tokenizer needed
    header = json.loads(built_report.records.read_text().splitlines()[0])
    assert Path(header["template_profile"]["tokenizer_name"]) == built_report.tokenizer_dir
    out = tmp_path / "report.html"
    assert main(["report", str(built_report.records), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == built_report.stdout.strip().replace(str(built_report.html_path), str(out))
    assert out.read_text(encoding="utf-8") == built_report.html


def test_every_section_is_there(built_report):
    html = built_report.html
    for name in SECTIONS:
        assert section(html, name).strip()
    assert "<svg" in section(html, "steps")
    assert re.findall(r"<h3>(\d+)\. ", section(html, "examples")) == ["1", "2", "3", "4", "5"]  # five, ranked


def test_summary_shows_the_engine_failure_prominently_and_counts_per_cause(built_report):
    summary = section(built_report.html, "summary")
    assert "ENGINE VIEW: 1 failure in 1 rollout — must be 0" in text_of(summary)
    assert "45.5%" in summary
    for cause in Cause:  # every cause has a row, including those that never occurred
        assert f"<code>{cause.value}</code>" in summary
    row = re.search(r"<code>special_token_injected</code>.*?</tr>", summary, re.DOTALL)
    assert row and re.findall(r"<td[^>]*>(\d+)</td>", row.group(0)) == ["0", "2", "1"]  # allowed, defects, rollouts
    assert "<code>escaped_special</code>" in summary and "<code>boundary</code>" in summary


def test_plot_and_per_turn_table_name_the_causes(built_report):
    steps = section(built_report.html, "steps")
    turns = section(built_report.html, "turns")
    for cause in PRESENT:
        assert cause.value in steps and f"<code>{cause.value}</code>" in turns
    assert "defects per cause (must stay at 0)" in steps and "turn 1" in turns


def test_examples_rank_the_engine_failure_first_and_mark_findings_and_gaps(built_report):
    examples = section(built_report.html, "examples")
    first = examples.split("<h3>")[1]
    assert "ENGINE VIEW FAILED" in first and "engine view: logprob" in first
    assert re.search(r'title="[^"]*ENGINE VIEW FAILURE: logprob', first)  # the failing token says so
    # The missing "\n" (boundary_missing) is a zero-length span: a marker with the template's text.
    assert re.search(r'title="finding \d+: boundary_missing \(defect\)[^"]*">\d+ boundary_missing<', examples)
    assert 'title="the template renders this here; the stream has no token for it">⊕' in examples
    assert "↵" in examples and "·" in examples  # whitespace is visible
    assert "tokens folded, click to show" in examples  # the long tool prompt is folded
    # Every token can tell its id, position, kind, mask and logprob.
    assert re.search(r'title="position \d+ · id \d+ · sampled · mask 1 · turn \d · logprob -0\.\d{4}', examples)


class _Page(HTMLParser):
    """The tags a browser would build and the text it would show (whitespace markers removed)."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_hostile_tool_output_is_shown_as_text(built_report):
    html = built_report.html
    page = _Page()
    page.feed(section(html, "examples"))
    text = "".join(page.text).replace("·", " ").replace("↵\n", "\n")
    assert "script" not in page.tags and "<script" not in html.lower()  # no script at all, none from records
    assert '<script>alert("pwned")</script>2' in text  # the tokens read back as the tool's text
    assert "special_token_injected<|im_end|>" in text  # the injected token, after its finding's marker
    assert "&lt;script" in html and "&lt;|im_end|&gt;" in html and "<|im_end|>" not in html
    assert HOSTILE.split("<|im_end|>")[0] not in html


def test_page_is_self_contained(built_report):
    html = built_report.html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html)
    assert "@import" not in html and "<link" not in html
    # The only URLs are the SVG namespace ids, which browsers never fetch.
    assert set(re.findall(r"https?://[^\s\"')]+", html)) <= {
        "http://www.w3.org/2000/svg",
        "http://www.w3.org/1999/xlink",
    }


def test_check_template_html_is_the_reports_audit_section(built_report, tmp_path, capsys):
    page = tmp_path / "audit.html"
    assert main(["check-template", str(built_report.tokenizer_dir), "--html", str(page)]) == 0
    assert f"wrote {page}" in capsys.readouterr().err
    standalone = page.read_text(encoding="utf-8")
    audit = section(standalone, "audit")
    assert audit == section(built_report.html, "audit")
    assert "repairable" in audit and "151643" in audit and "alias: gets a synthetic close" in audit
    assert "before tool" in audit and "&#39;\\n&#39;" in audit  # the repair "\n", decoded and escaped


def report_of(records, directory, tokenizer_dir) -> str:
    """The report the CLI builds from ``records`` (written with a real header), as HTML text."""
    from verl_ext.core.probe import probe_template
    from verl_ext.core.rendering import load_renderer
    from verl_ext.telemetry.records import RecordWriter, header_record

    writer = RecordWriter(directory, header_record(probe_template(load_renderer(tokenizer_dir))))
    for record in records:
        writer.write(record)
    out = directory / "report.html"
    assert main(["report", str(writer.path), "-o", str(out), "--tokenizer", str(tokenizer_dir)]) == 0
    return out.read_text(encoding="utf-8")


def text_of(html: str) -> str:
    page = _Page()
    page.feed(html)
    return re.sub(r"\s+", " ", "".join(page.text)).strip()


def test_clean_records_say_so(tmp_path, all_records, tokenizer_dirs):
    html = report_of(all_records[:1], tmp_path, tokenizer_dirs["qwen3"])
    verdict = text_of(section(html, "verdict"))
    assert verdict.startswith("All clear: 1 rollout checked; each trains on exactly the tokens the engine sampled")
    assert "What to do" not in verdict and "No rollout has an engine failure or a finding." in html


def test_the_verdict_leads_with_everything_and_says_what_to_do(built_report):
    verdict = text_of(section(built_report.html, "verdict"))
    assert verdict.startswith("Not safe to train: in 1 rollout the trainer's tokens, mask or logprobs are not what")
    assert "5 of 11 rollouts (45.5%) have an engine failure or a defect" in verdict
    # Worst first: the engine failure, then each defect cause with its fix, then tokens lost, then what is allowed.
    order = [
        "engine view: 1 failure of kind logprob",
        "calculate_log_probs=true",
        "special_token_injected: 2 defects",
        "escape_special_tokens=true",
        "boundary_missing: 1 defect",
        "close_missing: 1 defect",
        "--stop",
        "context_differs: 1 defect",
        "of sampled tokens lost to truncation",
        "response_length",
        "findings allowed",
    ]
    positions = [verdict.find(text) for text in order]
    assert -1 not in positions and positions == sorted(positions), list(zip(order, positions, strict=True))


def test_a_run_where_every_rollout_has_a_defect_is_not_green(tmp_path, all_records, tokenizer_dirs):
    defective = [r for r in all_records if not r.check.ok and r.check.engine_ok]
    html = report_of(defective, tmp_path, tokenizer_dirs["qwen3"])
    verdict = text_of(section(html, "verdict"))
    assert verdict.startswith(
        f"Fix before training: {len(defective)} of {len(defective)} rollouts (100.0%) have a defect"
    )
    assert "All clear" not in html


def test_tokens_lost_to_truncation_are_a_warning_with_their_share(tmp_path, all_records, tokenizer_dirs):
    truncated = [r for r in all_records if r.check.truncated]
    check = truncated[0].check
    share = 100 * check.lost_sampled_tokens / check.num_sampled
    html = report_of(truncated, tmp_path, tokenizer_dirs["qwen3"])
    verdict = text_of(section(html, "verdict"))
    assert verdict.startswith(f"Tokens are consistent, but {share:.1f}% of sampled tokens were cut by truncation")
    assert "response_length" in verdict


def test_every_cause_and_engine_failure_kind_has_a_one_line_fix(built_report):
    from verl_ext.check.findings import FailureKind
    from verl_ext.report.fixes import CAUSE_FIXES, ENGINE_FIXES

    missing = [c.value for c in Cause if c.value not in CAUSE_FIXES] + [
        k.value for k in FailureKind if k.value not in ENGINE_FIXES
    ]
    assert not missing, f"add a line for {missing} to verl_ext/report/fixes.py"
    assert all("\n" not in fix and fix.strip() for fix in [*CAUSE_FIXES.values(), *ENGINE_FIXES.values()])
    fixes = section(built_report.html, "fixes")
    for cause in Cause:
        assert f'id="fix-{cause.value}"' in fixes


def test_every_link_resolves_to_an_element_of_the_page(built_report):
    html = built_report.html
    ids = re.findall(r'\sid="([^"]+)"', html)
    assert len(ids) == len(set(ids)), "duplicate ids"
    targets = re.findall(r'href="#([^"]+)"', html)
    assert targets and set(targets) <= set(ids), sorted(set(targets) - set(ids))


def test_each_finding_links_to_its_tokens_and_its_fix_and_back(built_report):
    examples = section(built_report.html, "examples")
    chunks = examples.split('<div class="finding')[1:]
    assert len(chunks) == 5  # the five worst rollouts' findings
    for chunk in chunks:
        finding_id = re.match(r'[^"]*" id="([^"]+)"', chunk).group(1)
        marker = re.search(r'href="#([^"]+-m\d+)"', chunk).group(1)
        # The marker in the token view carries that id and links back to the finding.
        assert re.search(rf'id="{marker}" href="#{finding_id}"', examples)
        assert re.search(r'href="#fix-[a-z_]+">all fixes', chunk)
    failure = re.search(r'<div class="failure" id="([^"]+)">.*?href="#([^"]+)">position', examples, re.DOTALL)
    assert failure and re.search(rf'id="{failure.group(2)}" href="#{failure.group(1)}"', examples)


def test_a_cause_the_policy_allows_is_not_drawn_as_a_defect(tmp_path, renderer_for, tokenizer_dirs):
    from report_rollouts import build_records

    from verl_ext.check import ALLOWED_BY_DESIGN, CheckPolicy
    from verl_ext.report.plots import CAUSE_COLORS

    policy = CheckPolicy(allowed_causes=ALLOWED_BY_DESIGN | {Cause.CLOSE_MISSING})
    html = report_of(build_records(renderer_for("qwen3"), policy), tmp_path, tokenizer_dirs["qwen3"])
    row = re.search(
        r"<tr[^>]*>\s*<td><span class=\"swatch\"[^>]*></span><code>close_missing</code>.*?</tr>",
        section(html, "summary"),
        re.DOTALL,
    ).group(0)
    assert "allowed by policy" in row and ">defect<" not in row
    assert CAUSE_COLORS[Cause.CLOSE_MISSING] not in row  # its warm defect colour is not used
    assert "close_missing" not in text_of(section(html, "verdict")).split("findings allowed")[0]


def test_turn_numbers_say_they_count_from_zero(built_report):
    assert "Turns count from 0: turn 0 is the first engine call" in section(built_report.html, "turns")
    assert "· turn 0 of 0–1 ·" in section(built_report.html, "examples")


def test_a_long_turn_is_folded_out_of_the_page(tmp_path, renderer_for, tokenizer_dirs):
    """A rollout whose single tool result is about 40k tokens (a defect, so it is shown token by token): the page
    stays about the size of the small report and names what it left out."""
    from long_rollouts import naive_repetitive

    from verl_ext.check import ConsistencyChecker
    from verl_ext.check.record import Rollout

    r = renderer_for("qwen3")
    ro = naive_repetitive(r, 40_000, turns=1)
    rollout = Rollout.of(ro.calls, ro.sample, ro.messages, TOOLS)
    record = rollout.record(ConsistencyChecker(r).check_rollout(rollout))
    html = report_of([record], tmp_path, tokenizer_dirs["qwen3"])
    assert ro.tokens > 40_000 and len(html.encode()) < 200_000
    assert re.search(r"⋯ \d{5} context tokens not shown \(positions \d+–\d+\)", html)
    assert "boundary_missing" in section(html, "examples")


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "does not exist"),
        ("header_only", "no rollout records"),
        ("not_json", "not valid JSON"),
        ("no_folder", "folder"),
        ("no_tokenizer", "pass --tokenizer DIR"),
    ],
)
def test_errors_name_the_problem_and_exit_2(setup, message, built_report, tmp_path, capsys):
    lines = built_report.records.read_text().splitlines()
    records = tmp_path / "records.jsonl"
    out = tmp_path / "report.html"
    extra = ["--tokenizer", str(built_report.tokenizer_dir)]
    if setup == "missing":
        records = tmp_path / "nope.jsonl"
    elif setup == "header_only":
        records.write_text(lines[0] + "\n")
    elif setup == "not_json":
        records.write_text("not json\n")
    elif setup == "no_folder":
        records = built_report.records
        out = tmp_path / "missing-folder" / "report.html"
    else:
        records.write_text("\n".join(lines[1:]) + "\n")  # no header: nothing names the tokenizer
        extra = []
    assert main(["report", str(records), "-o", str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("verl-ext report: error:") and message in err
    assert not Path(out).exists()


def test_a_rollout_whose_check_ran_out_of_time_makes_the_verdict_amber(tmp_path, renderer_for, tokenizer_dirs):
    from long_rollouts import repetitive_tool_output

    from verl_ext.check import CheckPolicy, ConsistencyChecker
    from verl_ext.check.record import Rollout

    r = renderer_for("qwen3")
    ro = repetitive_tool_output(r, 2000, turns=1)
    rollout = Rollout.of(ro.calls, ro.sample, ro.messages, TOOLS)
    result = ConsistencyChecker(r, policy=CheckPolicy(template_view_budget_s=1e-6)).check_rollout(rollout)
    assert result.template_view_skipped
    record = rollout.record(result)
    html = report_of([record], tmp_path, tokenizer_dirs["qwen3"])
    verdict = text_of(section(html, "verdict"))
    assert verdict.startswith("Tokens are consistent, but the template view was skipped on 1 rollout")
    assert "template_view_budget_s" in verdict and "template view skipped" in section(html, "rollouts")
