"""Redraw the report's pictures in docs/images, each a page opened in headless chromium:

- report-demo.png: build/demo/report.html, the page `make demo` writes (the README shows it): drawn 1,000 px wide so
  it reads at the README's width, the sections a new user reads first (verdict, summary, what to do, numerics, all
  rollouts; the per-step plots, the per-turn table, the worst examples and the template audit left out by hiding
  their sections), the page's empty bottom trimmed;
- report-clean.png and report-defective.png: the report on real Qwen3 rollout records (the test builder's).

Each is reduced to a palette of ``COLOURS`` (a small file).

    make demo && PYTHONPATH=. .venv/bin/python scripts/report_screenshots.py      # needs chromium
    PYTHONPATH=. .venv/bin/python scripts/report_screenshots.py --only report-demo.png   # the README's picture alone
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "check"), str(ROOT / "tests" / "report")]

from PIL import Image  # noqa: E402
from report_rollouts import build_records  # noqa: E402

from verl_ext.core.probe import probe_template  # noqa: E402
from verl_ext.core.rendering import load_renderer  # noqa: E402
from verl_ext.report import build_report, write_html  # noqa: E402
from verl_ext.telemetry.records import RecordWriter, header_record  # noqa: E402

WIDTH = 1400
SHOTS = {"report-clean.png": 1500, "report-defective.png": 2300}  # page height drawn
DEMO_REPORT = ROOT / "build" / "demo" / "report.html"
DEMO_WIDTH, DEMO_HEIGHT = 1100, 6000  # drawn tall, then the empty bottom trimmed
DEMO_HIDDEN = ("steps", "turns", "examples", "audit")  # section ids left out of the README's picture
COLOURS = 128  # the palette every picture is reduced to (a small file)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", choices=["report-demo.png", *SHOTS], help="draw this picture alone")
    args = p.parse_args(argv)
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        sys.exit("chromium is not installed (apt-get install -y chromium)")
    if args.only in (None, "report-demo.png"):
        if not DEMO_REPORT.is_file():
            sys.exit(f"{DEMO_REPORT.relative_to(ROOT)} is missing: run `make demo` first (it writes the report drawn)")
        draw_demo(browser)
    if args.only == "report-demo.png":
        return 0
    tokenizer = ROOT / "build" / "tokenizers" / "qwen3"
    r = load_renderer(tokenizer)
    records = build_records(r)
    clean = [rec for rec in records if rec.check.ok and not rec.check.truncated]
    os.chdir(ROOT)  # the page names its record files as given: relative to the repository, no machine path
    for name, chosen in (("report-clean.png", clean), ("report-defective.png", records)):
        if args.only not in (None, name):
            continue
        folder = Path("build") / "report-screenshots" / name.removesuffix(".png")
        shutil.rmtree(folder, ignore_errors=True)
        writer = RecordWriter(folder, header_record(probe_template(r)))
        for record in chosen:
            writer.write(record)
        page = write_html(folder / "report.html", build_report([writer.path], r.decode).html)
        with tempfile.TemporaryDirectory() as tmp:
            draw(browser, page.resolve(), name, Path(tmp))
        out = ROOT / "docs" / "images" / name
        with Image.open(out) as drawn:
            save_small(drawn.convert("RGB"), out)
    return 0


def draw_demo(browser: str) -> None:
    """docs/images/report-demo.png: the demo's report with the ``DEMO_HIDDEN`` sections hidden (a copy of the page
    beside it, so its links and images resolve alike), the page's empty bottom trimmed, reduced to a palette."""
    html = DEMO_REPORT.read_text(encoding="utf-8")
    hide = ", ".join(f"section#{name}" for name in DEMO_HIDDEN)
    if any(f'<section id="{name}">' not in html for name in DEMO_HIDDEN):
        sys.exit(f"{DEMO_REPORT.relative_to(ROOT)} lacks one of the sections {DEMO_HIDDEN}: update DEMO_HIDDEN")
    copy = DEMO_REPORT.with_name("report-screenshot.html")
    copy.write_text(html.replace("</head>", f"<style>{hide} {{ display: none; }}</style></head>", 1), encoding="utf-8")
    out = ROOT / "docs" / "images" / "report-demo.png"
    with tempfile.TemporaryDirectory() as tmp:
        draw(browser, copy, "report-demo.png", Path(tmp), (DEMO_WIDTH, DEMO_HEIGHT))
    copy.unlink()
    with Image.open(out) as drawn:
        page = drawn.convert("RGB")
    save_small(page.crop((0, 0, page.width, content_bottom(page) + 24)), out)


def save_small(page: Image.Image, out: Path) -> None:
    """``page`` written to ``out`` reduced to a palette of ``COLOURS`` (the page's flat colours survive it)."""
    page.quantize(COLOURS, dither=Image.Dither.NONE).save(out, optimize=True)
    print(f"  {page.width}x{page.height} px, {out.stat().st_size / 1024:.0f} KiB", flush=True)


def content_bottom(page: Image.Image) -> int:
    """The last pixel row that is not the page's background (the colour of its bottom-left corner)."""
    background = page.getpixel((0, page.height - 1))
    rows = page.load()
    for y in range(page.height - 1, -1, -1):
        if any(rows[x, y] != background for x in range(0, page.width, 4)):
            return y
    return page.height - 1


def draw(browser: str, page: Path, name: str, scratch: Path, size: tuple[int, int] | None = None) -> None:
    """docs/images/``name``: the top of ``page`` as headless chromium draws it at ``size`` (width, height; default
    ``WIDTH`` by the shot's height), ``scratch`` holding its profile."""
    out = ROOT / "docs" / "images" / name
    width, height = size or (WIDTH, SHOTS[name])
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
            f"--window-size={width},{height}",
            f"--screenshot={out}",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )


if __name__ == "__main__":
    sys.exit(main())
