"""Report thumbnails: each distinct image of a rollout gets one small PNG beside its records (keyed by digest), and the
report shows it beside the image's placeholder run; a thumbnail missing, of another image, or that cannot be written
is said, never hidden, and never costs a record."""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import re
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from vl_rollouts import drive, make_image

from verl_ext.check.record import Rollout
from verl_ext.core.images import ImageTokens, image_digest
from verl_ext.core.rendering import ChatRenderer
from verl_ext.report import build_report
from verl_ext.report.load import load_records
from verl_ext.report.thumbnails import thumbnail_counts
from verl_ext.runtime import RolloutRuntime
from verl_ext.runtime.images import image_sample
from verl_ext.runtime.rollout_runtime import THUMBNAIL_FAILURES, WRITE_FAILURES
from verl_ext.telemetry.thumbnails import (
    THUMBNAIL_MAX_BYTES,
    THUMBNAIL_SIDE,
    ThumbnailError,
    ThumbnailWriter,
    draw_thumbnail,
)

PROMPT, SHOT, OTHER = make_image(100, 100, 1), make_image(300, 200, 2), make_image(56, 112, 3)


def rollout_of(renderer: ChatRenderer, tokens: ImageTokens, prompt: list[Any], tools: list[list[Any]]) -> Rollout:
    """A driven screenshot rollout as the loop hands it on: the sample, record messages and pixels of
    ``image_sample`` (the production path), the record's image evidence."""
    driven = drive(renderer, tokens, prompt, tools)
    cut = image_sample(driven.trajectory, None)
    t = driven.trajectory
    return Rollout.of(
        driven.calls,
        cut.sample,
        cut.record_messages,
        t.tools,
        prompt_messages=1,
        kinds=[k.value for k in t.kinds],
        extra={"images": cut.record_images},
        pixels=cut.pixels,
    )


def write(rt: RolloutRuntime, *rollouts: Rollout) -> Counter[str]:
    counters: Counter[str] = Counter()
    for rollout in rollouts:
        rt.judge(rollout, counters)
    return counters


@pytest.fixture
def two_rollouts(vl_renderer: ChatRenderer, image_tokens: ImageTokens) -> list[Rollout]:
    """Rollout 1: the prompt image, then the same screenshot in two tool results; rollout 2 shares the prompt image
    and gets another. 5 spans, 3 distinct images."""
    return [
        rollout_of(vl_renderer, image_tokens, [PROMPT], [[SHOT], [SHOT]]),
        rollout_of(vl_renderer, image_tokens, [PROMPT], [[OTHER]]),
    ]


def report_html(records: Path, renderer: ChatRenderer) -> str:
    return build_report([records], renderer.decode).html


def image_spans_in(html: str) -> list[dict[str, str]]:
    """Each image span the page shows: its digest, the thumbnail's digest (None without <img>), the text said."""
    out = []
    for found in re.finditer(r'<span class="image-span[^"]*".*?</span>\s*</span>', html, re.S):
        block = found.group(0)
        after = re.search(r'class="t [^"]*" title="position (\d+) ', html[found.end() :])
        img = re.search(r'<img class="thumb" src="data:image/png;base64,([^"]+)"[^>]*data-digest="([0-9a-f]+)"', block)
        out.append(
            {
                "digest": re.search(r'data-digest="([0-9a-f]+)"', block).group(1),
                "img": img.group(2) if img else None,
                "png": base64.b64decode(img.group(1)) if img else None,
                "tag": re.search(r'class="mark image">(I\d+)', block).group(1),
                "text": re.sub(r"<[^>]+>", "", block),
                "next_token": int(after.group(1)) if after else -1,  # the position of the token it stands before
            }
        )
    return out


def test_each_distinct_image_is_written_once_and_shown_beside_each_span(
    two_rollouts: list[Rollout], vl_renderer: ChatRenderer, tmp_path: Path
) -> None:
    from PIL import Image

    rt = RolloutRuntime.build(vl_renderer, records_dir=tmp_path)
    first = write(rt, two_rollouts[0])
    folder = tmp_path / "thumbnails"
    when = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert sorted(when) == sorted(f"{image_digest(im)}.png" for im in (PROMPT, SHOT))  # the shot sent twice: once
    write(rt, two_rollouts[1])  # shares the prompt image: not drawn again
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted(f"{image_digest(im)}.png" for im in (PROMPT, SHOT, OTHER))
    assert all((folder / n).stat().st_mtime_ns == t for n, t in when.items())
    assert not first[THUMBNAIL_FAILURES] and not first[WRITE_FAILURES]
    # another process (worker) writing the same images finds them there and draws none
    again = ThumbnailWriter(folder)
    assert again.write({**two_rollouts[0].pixels, **two_rollouts[1].pixels}) == [] and again.written_bytes == 0
    for name in names:  # bounded: a PNG at most 96 px long side, within the byte cap, naming its image
        data = (folder / name).read_bytes()
        with Image.open(io.BytesIO(data)) as png:
            assert png.format == "PNG" and max(png.size) <= THUMBNAIL_SIDE and len(data) <= THUMBNAIL_MAX_BYTES
            assert png.text["verl_ext-digest"] == name.removesuffix(".png")
    assert Image.open(folder / f"{image_digest(SHOT)}.png").size == (96, 64)  # 300x200, aspect kept
    assert Image.open(folder / f"{image_digest(SHOT)}.png").text["verl_ext-size"] == "300x200"

    (records,) = tmp_path.glob("*.jsonl")
    html = report_html(records, vl_renderer)
    shown = image_spans_in(html)
    lines = [json.loads(line) for line in records.read_text().splitlines()[1:]]
    assert [len(line["images"]["engine"]) for line in lines] == [3, 2]
    spans = lines[0]["images"]["engine"]  # a clean run: the first rollout with images is shown
    assert len(shown) == 3 and [s["digest"] for s in spans] == [image_digest(im) for im in (PROMPT, SHOT, SHOT)]
    for span, seen in zip(spans, shown, strict=True):
        assert seen["tag"] == f"I{span['index']}" and seen["digest"] == seen["img"] == span["digest"]
        with Image.open(io.BytesIO(seen["png"])) as png:
            assert png.text["verl_ext-digest"] == span["digest"]
        assert f"{span['length']} placeholders" in seen["text"] and "×".join(map(str, span["grid"])) in seen["text"]
    assert "300×200 px" in shown[1]["text"] and "100×100 px" in shown[0]["text"]
    # each thumbnail sits right before the first placeholder token of its span
    assert [seen["next_token"] for seen in shown] == [span["position"] for span in spans]
    counts = thumbnail_counts(load_records([records]).rollouts)
    assert counts is not None
    assert counts.line() == f"images: 5 in 2 rollouts (3 distinct); thumbnails: 3 of 3 in {folder}"


def test_a_clean_run_shows_one_rollout_for_its_images(
    two_rollouts: list[Rollout], vl_renderer: ChatRenderer, tiny_vl_dir: Path, tmp_path: Path, capsys: Any
) -> None:
    from verl_ext.cli.main import main

    rt = RolloutRuntime.build(vl_renderer, records_dir=tmp_path)
    write(rt, *two_rollouts)
    (records,) = tmp_path.glob("*.jsonl")
    folder = tmp_path / "thumbnails"
    (folder / f"{image_digest(OTHER)}.png").unlink()
    assert main(["report", str(records), "-o", str(tmp_path / "r.html"), "--tokenizer", str(tiny_vl_dir)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("wrote ") and "0 rollouts with defects" in out[0]
    assert out[1] == (
        f"images: 5 in 2 rollouts (3 distinct); thumbnails: 2 of 3 in {folder} (1 missing: the page says so beside "
        "each span)"
    )
    html = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert "shown for its images" in html and len(image_spans_in(html)) == 3  # the first rollout
    assert '5</div><div class="k">images in 2 rollouts (3 distinct; thumbnails: 2 found, 1 missing)' in html


def test_a_wrong_or_missing_thumbnail_is_shown_as_such(
    two_rollouts: list[Rollout], vl_renderer: ChatRenderer, tmp_path: Path
) -> None:
    rt = RolloutRuntime.build(vl_renderer, records_dir=tmp_path)
    write(rt, *two_rollouts)
    (records,) = tmp_path.glob("*.jsonl")
    folder = tmp_path / "thumbnails"
    prompt, shot, other = (image_digest(im) for im in (PROMPT, SHOT, OTHER))
    # the page before: every span of the shown rollout has its picture
    assert [s["img"] for s in image_spans_in(report_html(records, vl_renderer))] == [prompt, shot, shot]
    # mutation: the prompt image's file holds another image's thumbnail (a writer keyed by the wrong digest)
    shutil.copy(folder / f"{other}.png", folder / f"{prompt}.png")
    (folder / f"{shot}.png").unlink()  # mutation: a thumbnail missing
    html = report_html(records, vl_renderer)
    shown = image_spans_in(html)
    assert [s["digest"] for s in shown] == [prompt, shot, shot] and all(s["img"] is None for s in shown)
    assert f"WRONG THUMBNAIL: the file for {prompt} was drawn from image {other}" in shown[0]["text"]
    assert 'class="image-span wrong"' in html and html.count("WRONG THUMBNAIL") == 1
    assert all("thumbnail missing" in s["text"] and "size unknown" in s["text"] for s in shown[1:])
    counts = thumbnail_counts(load_records([records]).rollouts)
    assert counts is not None and "thumbnails: 2 of 3" in counts.line() and "1 missing" in counts.line()
    # no folder at all (thumbnails off, older records): each span says so
    shutil.rmtree(folder)
    texts = [s["text"] for s in image_spans_in(report_html(records, vl_renderer))]
    assert len(texts) == 3 and all("no thumbnails folder" in t for t in texts)


def test_a_broken_thumbnail_folder_loses_no_record_and_is_logged_once(
    two_rollouts: list[Rollout], vl_renderer: ChatRenderer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "thumbnails").write_text("not a folder")  # every thumbnail write fails
    rt = RolloutRuntime.build(vl_renderer, records_dir=tmp_path)
    with caplog.at_level(logging.ERROR, logger="verl_ext.runtime"):
        counters = write(rt, *two_rollouts, *two_rollouts)
    (records,) = tmp_path.glob("*.jsonl")
    assert len(records.read_text().splitlines()) == 1 + 4  # header + every record
    assert counters[THUMBNAIL_FAILURES] == 4 and counters[WRITE_FAILURES] == 0
    errors = [r.getMessage() for r in caplog.records if "thumbnail" in r.getMessage()]
    assert len(errors) == 1 and "the record was written" in errors[0] and "records.thumbnails=false" in errors[0]
    texts = [s["text"] for s in image_spans_in(report_html(records, vl_renderer))]
    assert texts and all("thumbnail missing" in t for t in texts)


def test_pixels_paired_with_another_digest_are_refused(tmp_path: Path) -> None:
    """Mutation of the loop's side: the image handed for a digest is another one; the writer draws nothing for it."""
    writer = ThumbnailWriter(tmp_path)
    with pytest.raises(ThumbnailError, match=f"the image given for digest {image_digest(PROMPT)} has digest"):
        writer.write({image_digest(PROMPT): SHOT, image_digest(OTHER): OTHER})
    assert [p.name for p in tmp_path.iterdir()] == [f"{image_digest(OTHER)}.png"]  # the good one still written
    with pytest.raises(ThumbnailError, match="not an image digest"):
        writer.write({"../../etc/passwd": PROMPT})


def test_the_byte_caps_hold(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import numpy as np
    from PIL import Image

    noise = Image.fromarray(np.random.default_rng(0).integers(0, 256, (96, 96, 4), dtype=np.uint8), "RGBA")
    full_colour = io.BytesIO()
    noise.save(full_colour, format="PNG", optimize=True)
    assert full_colour.tell() > THUMBNAIL_MAX_BYTES  # this one needs the palette to fit
    png = draw_thumbnail(noise, image_digest(noise))
    assert len(png) <= THUMBNAIL_MAX_BYTES
    with pytest.raises(ThumbnailError, match="over the cap of 100"):
        draw_thumbnail(noise, image_digest(noise), max_bytes=100)
    big = make_image(1280, 720, 5)
    before = big.tobytes()
    draw_thumbnail(big, image_digest(big))
    assert big.size == (1280, 720) and big.tobytes() == before  # the caller's image is not changed
    # one process's thumbnails stop at its total cap, said once
    writer = ThumbnailWriter(tmp_path / "t", max_total_bytes=len(draw_thumbnail(PROMPT, image_digest(PROMPT))))
    with caplog.at_level(logging.WARNING, logger="verl_ext.records"):
        writer.write({image_digest(im): im for im in (PROMPT, SHOT, OTHER)})
    assert [p.name for p in (tmp_path / "t").iterdir()] == [f"{image_digest(PROMPT)}.png"] and writer.full
    assert sum("thumbnails of this process reached" in r.getMessage() for r in caplog.records) == 1


def test_thumbnails_switch_off_where_records_are_configured(
    two_rollouts: list[Rollout], vl_renderer: ChatRenderer, tmp_path: Path
) -> None:
    from verl_ext.core.errors import OptionsError
    from verl_ext.plugin.options import LoopOptions

    rt = RolloutRuntime.build(vl_renderer, records_dir=tmp_path, thumbnails=False)
    write(rt, *two_rollouts)
    assert rt.thumbnails is None and not (tmp_path / "thumbnails").exists() and list(tmp_path.glob("*.jsonl"))
    assert LoopOptions.from_mapping({"records": {"thumbnails": False}}).records.thumbnails is False
    assert LoopOptions.from_mapping({}).records.thumbnails is True
    with pytest.raises(OptionsError, match="verl_ext.records.thumbnails"):
        LoopOptions.from_mapping({"records": {"thumbnails": "maybe"}})


# Every section but the examples hidden, so the screenshot shows the image spans at the top.
EXAMPLES_ONLY = "<style>header, nav, section:not(#examples), .legend { display: none; }</style></body>"


def test_the_browser_draws_each_thumbnail_beside_its_span(
    two_rollouts: list[Rollout], vl_renderer: ChatRenderer, tmp_path: Path
) -> None:
    import sys

    import numpy as np
    from PIL import Image

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "report"))
    from test_report_browser import headless

    rt = RolloutRuntime.build(vl_renderer, records_dir=tmp_path / "records")
    write(rt, *two_rollouts)
    (records,) = (tmp_path / "records").glob("*.jsonl")
    (tmp_path / "records" / "thumbnails" / f"{image_digest(SHOT)}.png").unlink()  # its two spans say it is missing
    page = report_html(records, vl_renderer)
    assert [s["img"] for s in image_spans_in(page)] == [image_digest(PROMPT), None, None]
    shown = tmp_path / "examples.html"
    shown.write_text(page.replace("</body>", EXAMPLES_ONLY), encoding="utf-8")
    shot = tmp_path / "examples.png"
    headless(shown, tmp_path / "profile-shot", f"--screenshot={shot}")
    with Image.open(shot) as image:
        pixels = np.asarray(image.convert("RGB")).astype(int)
    # the prompt image's flat colour, drawn by the browser as a 96x96 thumbnail (the data URL decoded and laid out)
    colour = np.array(PROMPT.getpixel((50, 50)))
    drawn = (np.abs(pixels - colour).sum(axis=2) < 12).sum()
    assert 90 * 90 <= drawn <= 97 * 97, drawn
    keep = os.environ.get("VERL_EXT_KEEP_SCREENSHOT")  # a folder: keep the picture to look at
    if keep:
        shutil.copy(shot, Path(keep) / "report-thumbnails.png")
