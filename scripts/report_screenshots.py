"""Redraw docs/images/report-clean.png and report-defective.png: the report on real Qwen3 rollout records (the test
builder's), opened in headless chromium.

    PYTHONPATH=. .venv/bin/python scripts/report_screenshots.py      # needs chromium and build/tokenizers
"""

from __future__ import annotations

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
SHOTS = {"report-clean.png": 1500, "report-defective.png": 2300}  # page height drawn


def main() -> int:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        sys.exit("chromium is not installed (apt-get install -y chromium)")
    tokenizer = ROOT / "build" / "tokenizers" / "qwen3"
    r = load_renderer(tokenizer)
    records = build_records(r)
    clean = [rec for rec in records if rec.check.ok and not rec.check.truncated]
    with tempfile.TemporaryDirectory() as tmp:
        for name, chosen in (("report-clean.png", clean), ("report-defective.png", records)):
            folder = Path(tmp) / name.removesuffix(".png")
            folder.mkdir()
            writer = RecordWriter(folder, header_record(probe_template(r)))
            for record in chosen:
                writer.write(record)
            page = write_html(folder / "report.html", build_report([writer.path], r.decode).html)
            out = ROOT / "docs" / "images" / name
            print(f"drawing {out} from {len(chosen)} rollouts ...", flush=True)
            subprocess.run(
                [
                    browser,
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-dev-shm-usage",
                    "--hide-scrollbars",
                    f"--user-data-dir={folder / 'profile'}",
                    f"--window-size={WIDTH},{SHOTS[name]}",
                    f"--screenshot={out}",
                    page.as_uri(),
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
