"""Redraw the report's pictures in docs/images, each a page opened in headless chromium:

- report-demo.png: build/demo/report.html, the page `make demo` writes (the README shows it);
- report-clean.png and report-defective.png: the report on real Qwen3 rollout records (the test builder's).

    make demo && PYTHONPATH=. .venv/bin/python scripts/report_screenshots.py      # needs chromium
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "check"), str(ROOT / "tests" / "report")]

from report_rollouts import build_records  # noqa: E402

from verl_ext.core.probe import probe_template  # noqa: E402
from verl_ext.core.rendering import load_renderer  # noqa: E402
from verl_ext.report import build_report, write_html  # noqa: E402
from verl_ext.telemetry.records import RecordWriter, header_record  # noqa: E402

WIDTH = 1400
SHOTS = {"report-clean.png": 1500, "report-defective.png": 2300, "report-demo.png": 1500}  # page height drawn
DEMO_REPORT = ROOT / "build" / "demo" / "report.html"


def main() -> int:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        sys.exit("chromium is not installed (apt-get install -y chromium)")
    if not DEMO_REPORT.is_file():
        sys.exit(f"{DEMO_REPORT.relative_to(ROOT)} is missing: run `make demo` first (it writes the report drawn)")
    with tempfile.TemporaryDirectory() as tmp:
        draw(browser, DEMO_REPORT, "report-demo.png", Path(tmp))
    tokenizer = ROOT / "build" / "tokenizers" / "qwen3"
    r = load_renderer(tokenizer)
    records = build_records(r)
    clean = [rec for rec in records if rec.check.ok and not rec.check.truncated]
    os.chdir(ROOT)  # the page names its record files as given: relative to the repository, no machine path
    for name, chosen in (("report-clean.png", clean), ("report-defective.png", records)):
        folder = Path("build") / "report-screenshots" / name.removesuffix(".png")
        shutil.rmtree(folder, ignore_errors=True)
        writer = RecordWriter(folder, header_record(probe_template(r)))
        for record in chosen:
            writer.write(record)
        page = write_html(folder / "report.html", build_report([writer.path], r.decode).html)
        with tempfile.TemporaryDirectory() as tmp:
            draw(browser, page.resolve(), name, Path(tmp))
    return 0


def draw(browser: str, page: Path, name: str, scratch: Path) -> None:
    """docs/images/``name``: the top of ``page`` as headless chromium draws it (``scratch`` holds its profile)."""
    out = ROOT / "docs" / "images" / name
    print(f"drawing {out.relative_to(ROOT)} from {page.name} ...", flush=True)
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            f"--user-data-dir={scratch / 'profile'}",
            f"--window-size={WIDTH},{SHOTS[name]}",
            f"--screenshot={out}",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )


if __name__ == "__main__":
    sys.exit(main())
