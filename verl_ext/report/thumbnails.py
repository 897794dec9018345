"""The thumbnails the report shows beside each image's span, read from the ``thumbnails`` folder beside the records.

A thumbnail is embedded as a data URL, so the page stays one file, only when it is what the writer promises
(``verl_ext.telemetry.thumbnails``): a PNG within the per-image byte cap and side, drawn from the image the record
names (its ``verl_ext-digest`` text equals the digest). Anything else is said beside the span instead of a picture:
no file (thumbnails off, a failed write, the writer's cap), a file that is not such a PNG, or the thumbnail of
another image. The page embeds at most ``PAGE_BUDGET`` bytes of thumbnails; past it the span says so.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_ext.check.record import RolloutRecord
from verl_ext.report.load import RolloutRef
from verl_ext.telemetry.thumbnails import (
    DIGEST_KEY,
    SIZE_KEY,
    THUMBNAIL_MAX_BYTES,
    THUMBNAIL_SIDE,
    ThumbnailError,
    thumbnail_path,
    thumbnails_folder,
)

PAGE_BUDGET = 4 * 1024 * 1024  # bytes of thumbnails one page embeds at most (each shown copy counts)


@dataclass(frozen=True)
class Thumbnail:
    """One image's thumbnail as the page shows it: ``data_url`` set when it is embedded, else ``problem`` says why
    not. ``size`` is the image's own size (``WxH`` px, from the thumbnail) when known."""

    digest: str
    data_url: str | None = None
    width: int = 0  # the thumbnail's px
    height: int = 0
    size: str = ""
    problem: str = ""
    wrong_image: bool = False  # the file holds the thumbnail of another image (a defect of the writer)


def read_thumbnail(folder: str | os.PathLike[str], digest: str) -> Thumbnail:
    """``digest``'s thumbnail in ``folder``, checked (module docstring); never raises."""
    try:
        path = thumbnail_path(folder, digest)
    except ThumbnailError as exc:
        return Thumbnail(digest, problem=f"no thumbnail: {exc}")
    if not path.is_file():
        if not Path(folder).is_dir():
            why = f"no thumbnails folder {str(folder)!r} (thumbnails off, or records from before thumbnails)"
        else:
            why = "its thumbnail was not written (a failed write or the writer's cap: see the run's log)"
        return Thumbnail(digest, problem=f"thumbnail missing: {why}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        return Thumbnail(digest, problem=f"thumbnail unreadable: {type(exc).__name__}: {exc.strerror or exc}")
    if len(data) > THUMBNAIL_MAX_BYTES:
        return Thumbnail(
            digest, problem=f"thumbnail not shown: {len(data)} bytes, over the cap of {THUMBNAIL_MAX_BYTES}"
        )
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
            kind, (width, height), text = image.format, image.size, dict(getattr(image, "text", {}))
    except Exception as exc:  # Pillow raises anything from OSError to SyntaxError on a broken file
        return Thumbnail(digest, problem=f"thumbnail not shown: not a readable PNG ({type(exc).__name__})")
    if kind != "PNG" or max(width, height) > THUMBNAIL_SIDE:
        return Thumbnail(
            digest,
            problem=f"thumbnail not shown: a {kind} of {width}x{height} px, not a PNG within {THUMBNAIL_SIDE} px",
        )
    drawn_from = str(text.get(DIGEST_KEY, ""))
    if drawn_from != digest:
        of = f"image {drawn_from}" if drawn_from else "an image it does not name"
        return Thumbnail(
            digest, problem=f"WRONG THUMBNAIL: the file for {digest} was drawn from {of}; not shown", wrong_image=True
        )
    url = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    return Thumbnail(digest, url, width, height, str(text.get(SIZE_KEY, "")))


class ThumbnailShelf:
    """The thumbnails of one page: each (folder, digest) read once, embedded copies counted against the budget."""

    def __init__(self, budget: int = PAGE_BUDGET) -> None:
        self.budget = budget
        self.embedded = 0
        self._read: dict[tuple[Path, str], Thumbnail] = {}

    def get(self, records_file: str | os.PathLike[str], digest: str) -> Thumbnail:
        """The thumbnail of ``digest`` for a rollout of ``records_file`` (its folder's ``thumbnails``), as shown once
        more on the page: past the budget, without its picture."""
        folder = thumbnails_folder(Path(records_file).parent)
        key = (folder, digest)
        if key not in self._read:
            self._read[key] = read_thumbnail(folder, digest)
        thumb = self._read[key]
        if thumb.data_url is None:
            return thumb
        if self.embedded + len(thumb.data_url) > self.budget:
            return Thumbnail(
                digest,
                size=thumb.size,
                problem=f"thumbnail not embedded: the page's thumbnail budget ({self.budget // 1024} KiB) is spent",
            )
        self.embedded += len(thumb.data_url)
        return thumb


@dataclass(frozen=True)
class ThumbnailCounts:
    """The records' images and where their thumbnails are (the command's line): image spans, rollouts with one,
    distinct images, and how many of those have a thumbnail file (checked when shown, beside each span)."""

    images: int
    rollouts: int
    distinct: int
    found: int
    folders: tuple[str, ...]

    def line(self) -> str:
        """``images: 4 in 2 rollouts (3 distinct); thumbnails: 3 of 3 in build/records/thumbnails``."""
        missing = self.distinct - self.found
        tail = f" ({missing} missing: the page says so beside each span)" if missing else ""
        return (
            f"images: {self.images} in {self.rollouts} rollout{'s' if self.rollouts != 1 else ''} ({self.distinct} "
            f"distinct); thumbnails: {self.found} of {self.distinct} in {', '.join(self.folders)}{tail}"
        )


def image_spans(record: RolloutRecord) -> list[dict[str, Any]]:
    """The record's image spans (its ``images`` evidence, the engine's side), well-formed ones only (a malformed
    one is the check's image view's to name)."""
    evidence = record.extra.get("images") if isinstance(record.extra, Mapping) else None
    spans = evidence.get("engine", ()) if isinstance(evidence, Mapping) else ()
    out = []
    for span in spans if isinstance(spans, list | tuple) else ():
        try:
            out.append(
                {
                    "index": int(span["index"]),
                    "position": int(span["position"]),
                    "length": int(span["length"]),
                    "grid": [int(v) for v in span["grid"]],
                    "digest": str(span["digest"]),
                    "turn": int(span["turn"]),
                }
            )
        except (KeyError, TypeError, ValueError):
            continue
    return out


def thumbnail_counts(rollouts: Sequence[RolloutRef]) -> ThumbnailCounts | None:
    """The counts over ``rollouts`` (None: no rollout holds an image); a file is looked for, not read."""
    spans = [(ref.file, image_spans(ref.record)) for ref in rollouts]
    with_images = [(f, s) for f, s in spans if s]
    if not with_images:
        return None
    distinct = {(thumbnails_folder(Path(f).parent), span["digest"]) for f, s in with_images for span in s}
    found = 0
    for folder, digest in distinct:
        with contextlib.suppress(ThumbnailError):
            found += thumbnail_path(folder, digest).is_file()
    folders = tuple(sorted({str(folder) for folder, _ in distinct}))
    return ThumbnailCounts(sum(len(s) for _, s in with_images), len(with_images), len(distinct), found, folders)
