"""The report rendered by a real headless browser (Debian's chromium): what a reader sees once the page is laid out
(headings, the engine-failure banner, the ranked examples and their token stream as text, the rows each filter leaves
visible), and the screenshot is a real page, not a blank one. CI installs chromium and sets
VERL_EXT_REQUIRE_BROWSER=1, so there this test can never be skipped."""

from __future__ import annotations

import html
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

WIDTH, HEIGHT = 1400, 2400
TIMEOUT = 120


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if os.environ.get("VERL_EXT_REQUIRE_BROWSER", "0") not in ("", "0"):  # `make test VERL_EXT_REQUIRE_BROWSER=0`
        pytest.fail("VERL_EXT_REQUIRE_BROWSER is set but chromium is not installed (apt-get install -y chromium)")
    pytest.skip("chromium is not installed (apt-get install -y chromium); set VERL_EXT_REQUIRE_BROWSER=1 to fail")


def headless(page: Path, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        f"--user-data-dir={profile}",  # its own profile: parallel runs and a read-only HOME must not matter
        f"--window-size={WIDTH},{HEIGHT}",
        *args,
        page.as_uri(),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, check=False)
    assert done.returncode == 0, f"chromium exited {done.returncode}: {done.stderr[-2000:]}"
    return done


# Appended to a copy of the page only (the report itself has no script): writes down what a reader sees once the
# browser has laid the page out with its own CSS (text of elements with a size, so hidden ones do not count).
SEEN = """<script>
const shown = el => el.getBoundingClientRect().height > 0;
const texts = sel => [...document.querySelectorAll(sel)].filter(shown).map(el => el.innerText.trim());
const seen = {
  headings: texts("section > h2"),
  banner: texts("#summary .banner.bad"),
  examples: texts("#examples .example > h3"),
  stream: texts("#examples .example")[0] || "",
  audit: texts("#audit")[0] || "",
};
const out = document.createElement("pre"); out.id = "seen"; out.textContent = JSON.stringify(seen);
document.body.appendChild(out);
</script>"""


def seen_in(page: Path, profile: Path, report: str, script: str) -> dict:
    """Run ``script`` at the end of a copy of the ``report`` page and return the JSON it leaves in ``<pre id=...>``."""
    marker = script.split('out.id = "')[1].split('"')[0]
    page.write_text(report.replace("</body>", script + "</body>"), encoding="utf-8")
    dom = headless(page, profile, "--dump-dom").stdout
    return json.loads(html.unescape(dom.split(f'<pre id="{marker}">')[1].split("</pre>")[0]))


def test_browser_renders_the_report(built_report, tmp_path):
    import numpy as np
    from PIL import Image

    assert "<script" not in built_report.html.lower()  # the report works without script
    seen = seen_in(tmp_path / "seen.html", tmp_path / "profile-dom", built_report.html, SEEN)
    assert seen["headings"] == [
        "Summary",
        "What to do, per cause",
        "Findings per cause over training steps",
        "Findings per turn",
        "Numerics: the trainer's logprobs beside the engine's",
        "All rollouts",
        "Worst examples",
        "Template audit",
    ]
    assert len(seen["banner"]) == 1 and seen["banner"][0].startswith("ENGINE VIEW: 1 failure in 1 rollout — must be 0")
    # Five worst examples, ranked: the engine-view failure first, then rollouts with defects.
    name = built_report.records.name
    examples = seen["examples"]
    assert [e.split(" #")[0] for e in examples] == [f"{k}. {name}" for k in range(1, 6)]
    assert examples[0].endswith("ENGINE VIEW FAILED") and all("defect" in e for e in examples[1:])
    # The first example's token stream reads as the conversation (whitespace drawn), long runs folded.
    stream = seen["stream"]
    assert "What·is·1+1?·Use·the·calculator.<|im_end|>↵" in stream and "<|im_start|>assistant↵" in stream
    assert "prompt tokens folded, click to show" in stream and "engine view: logprob" in stream
    assert "verdict repairable" in seen["audit"] and "<|im_end|>\t151645\tcloses a turn" in seen["audit"]

    shot = tmp_path / "report.png"
    headless(built_report.html_path, tmp_path / "profile-shot", f"--screenshot={shot}")
    assert shot.stat().st_size > 50_000
    with Image.open(shot) as image:
        rgb = image.convert("RGB")
    assert rgb.size == (WIDTH, HEIGHT)
    small = rgb.resize((WIDTH // 4, HEIGHT // 4))
    assert len(small.getcolors(maxcolors=1 << 20) or []) > 200  # text, plot and tables, not one flat colour
    # The engine-failure banner is drawn: styles applied, the top of the page is not just text on white.
    pixels = np.asarray(small)
    banner_red = int(((pixels[..., 0] > 190) & (pixels[..., 1] < 70) & (pixels[..., 2] < 70)).sum())
    assert banner_red > 1500, banner_red


# Appended to a copy of the page only (the report itself has no script): sets each filter as a person would pick it
# and writes down which rows the browser then shows, as laid out with the page's own CSS.
PROBE = """<script>
const rows = () => [...document.querySelectorAll("#rollouts tr")].slice(1)
  .filter(tr => tr.getBoundingClientRect().height > 0).map(tr => tr.cells[0].textContent.trim());
const pick = (id, value) => { const s = document.getElementById(id); s.value = value; };
const seen = {};
for (const [cause, step] of CASES) {
  pick("filter-cause", cause); pick("filter-step", step); seen[cause + "|" + step] = rows();
}
const out = document.createElement("pre"); out.id = "probe"; out.textContent = JSON.stringify(seen);
document.body.appendChild(out);
</script>"""


def test_the_rollout_list_filters_by_cause_and_step_in_the_browser(built_report, tmp_path):
    records = [json.loads(line) for line in built_report.records.read_text().splitlines()[1:]]
    name = built_report.records.name
    label = {id(r): f"{name} #{k}" for k, r in enumerate(records, 1)}

    def expected(cause: str, step: str) -> set[str]:
        keep = set()
        for r in records:
            causes = {f["cause"] for f in r["check"]["findings"]}
            causes |= {"engine"} if r["check"]["engine_failures"] else set()
            causes |= {"truncated"} if r["check"]["lost_sampled_tokens"] else set()
            causes = causes or {"clean"}
            if (not cause or cause in causes) and (not step or str(r["step"]) == step):
                keep.add(label[id(r)])
        return keep

    cases = [
        ("", ""),
        ("close_missing", ""),
        ("bpe_remerge", ""),
        ("", "3"),
        ("boundary_missing", "2"),
        ("clean", ""),
        ("engine", "3"),
        ("truncated", "0"),
    ]
    probe = PROBE.replace("CASES", json.dumps(cases))
    seen = seen_in(tmp_path / "probe.html", tmp_path / "profile-probe", built_report.html, probe)
    for cause, step in cases:
        shown = seen[f"{cause}|{step}"]
        assert set(shown) == expected(cause, step) and len(shown) == len(set(shown)), (cause, step, shown)
    assert len(seen["|"]) == len(records) and seen["truncated|0"] == []
    assert len(seen["close_missing|"]) == 1 and len(seen["|3"]) == 4


# Appended to a copy of the page only: where the rollout list starts, the zero-count rows a reader sees, and those
# seen once every folded line is opened (as a click on it opens it).
ZEROS = """<script>
const zeros = () => [...document.querySelectorAll("tr.zero:not(.none)")].filter(tr => tr.checkVisibility()).length;
const seen = {rollouts: Math.round(document.getElementById("rollouts").getBoundingClientRect().top), closed: zeros()};
document.querySelectorAll("details.zeros").forEach(d => { d.open = true; });
seen.opened = zeros();
const out = document.createElement("pre"); out.id = "zeros"; out.textContent = JSON.stringify(seen);
document.body.appendChild(out);
</script>"""


def test_a_clean_run_folds_the_causes_it_never_met(all_records, tmp_path, tokenizer_dirs):
    from test_report_html import report_of, section

    page = report_of(all_records[:1], tmp_path, tokenizer_dirs["qwen3"])
    assert "All clear" in section(page, "verdict")
    zero_rows = page.count('<tr class="zero"') + page.count('" class="zero"')
    seen = seen_in(tmp_path / "zeros.html", tmp_path / "profile-zeros", page, ZEROS)
    assert seen["closed"] == 0 and seen["opened"] == zero_rows > 60, seen  # every cause and kind, one click away
    # the rollout list starts within the first screen of this test's window, not 2.5 screens of zeros down
    assert seen["rollouts"] < HEIGHT, seen


# Appended to a copy of the page only: each laid-out table whose last column does not lie within the box that
# shows it (its scroll container): a reader at this width would not see it.
CUT = """<script>
const cut = [];
for (const table of document.querySelectorAll("table")) {
  if (!table.checkVisibility()) continue;
  const box = (table.closest(".scroll") || table.parentElement).getBoundingClientRect();
  for (const row of table.rows) {
    const r = row.cells[row.cells.length - 1].getBoundingClientRect();
    if (r.right > box.right + 1 || r.left < box.left - 1) {
      cut.push(table.closest("section").id + ": " + row.cells[row.cells.length - 1].innerText.trim().slice(0, 40));
      break;
    }
  }
}
const out = document.createElement("pre"); out.id = "cut"; out.textContent = JSON.stringify(cut);
document.body.appendChild(out);
</script>"""


def test_no_tables_last_column_is_cut_at_1400_px(built_report, tmp_path, renderer_for, tokenizer_dirs):
    """The report's records, and a rollout of 30 turns, each with a defect (a per-turn table wider than the page:
    the cause and the total stay in view while the turns scroll)."""
    from long_rollouts import naive_repetitive
    from rollouts import TOOLS
    from test_report_html import report_of

    from verl_ext.check import ConsistencyChecker
    from verl_ext.check.record import Rollout

    r = renderer_for("qwen3")
    ro = naive_repetitive(r, 3000, turns=30)
    rollout = Rollout.of(ro.calls, ro.sample, ro.messages, TOOLS)
    wide = report_of([rollout.record(ConsistencyChecker(r).check_rollout(rollout))], tmp_path, tokenizer_dirs["qwen3"])
    assert "turn 29" in wide
    for name, page in (("records", built_report.html), ("30 turns", wide)):
        assert seen_in(tmp_path / "cut.html", tmp_path / f"profile-{len(name)}", page, CUT) == [], name
