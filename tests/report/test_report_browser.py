"""The report rendered by a real headless browser (Debian's chromium): the sections exist in the rendered DOM and
the screenshot is a real page, not a blank one. CI installs chromium and sets VERL_EXT_REQUIRE_BROWSER=1, so
there this test can never be skipped."""

from __future__ import annotations

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
    if os.environ.get("VERL_EXT_REQUIRE_BROWSER"):
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


def test_browser_renders_the_report(built_report, tmp_path):
    import numpy as np
    from PIL import Image

    dom = headless(built_report.html_path, tmp_path / "profile-dom", "--dump-dom").stdout
    for name in ("verdict", "summary", "fixes", "steps", "turns", "rollouts", "examples", "audit"):
        assert f'<section id="{name}">' in dom
    assert "<svg" in dom and dom.count('class="example"') == 5 and dom.count('class="t ') > 1000
    assert "ENGINE VIEW: 1 failure" in dom and "<script" not in dom.lower()

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
    import json

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
    page = tmp_path / "probe.html"
    probe = PROBE.replace("CASES", json.dumps(cases))
    page.write_text(built_report.html.replace("</body>", probe + "</body>"), encoding="utf-8")
    dom = headless(page, tmp_path / "profile-probe", "--dump-dom").stdout
    seen = json.loads(dom.split('<pre id="probe">')[1].split("</pre>")[0].replace("&quot;", '"'))
    for cause, step in cases:
        shown = seen[f"{cause}|{step}"]
        assert set(shown) == expected(cause, step) and len(shown) == len(set(shown)), (cause, step, shown)
    assert len(seen["|"]) == len(records) and seen["truncated|0"] == []
    assert len(seen["close_missing|"]) == 1 and len(seen["|3"]) == 4
