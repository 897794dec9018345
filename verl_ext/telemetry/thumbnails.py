"""Thumbnails of a rollout's images, written beside its records so the report can show each image by its span.

Records hold each image as a digest, never its pixels. With thumbnails on (``verl_ext.records.thumbnails``, the
default where records are written), each distinct image also gets one small PNG in ``<records dir>/thumbnails/``,
named by its digest (``<digest>.png``): an image sent back in every turn, or shared by many rollouts and worker
processes, is stored once. Bounds:

- a thumbnail is at most ``THUMBNAIL_SIDE`` px on its long side and at most ``THUMBNAIL_MAX_BYTES`` bytes (a PNG
  over the cap is redrawn with a 64-colour palette; one still over it is not written);
- one writer (one process) writes at most ``max_total_bytes`` of thumbnails (the records' ``max_bytes``); past it
  new images get none, said once in the log;
- a digest already written (by this process or another, in this run or an earlier one) is not drawn again.

Each PNG names the digest of the image it was drawn from and that image's size (text chunks ``verl_ext-digest``,
``verl_ext-size``); the report checks the digest against the file name, so a thumbnail of another image is shown
as such. Pillow is imported here, at the integration edge; the token core never draws images.
"""

from __future__ import annotations

import io
import logging
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_ext.core.bounded_cache import LruCache
from verl_ext.core.images import image_digest

log = logging.getLogger("verl_ext.records")

THUMBNAILS_FOLDER = "thumbnails"  # under the records folder
THUMBNAIL_SIDE = 96  # px, the long side at most
THUMBNAIL_MAX_BYTES = 32 * 1024  # per thumbnail file
DIGEST_KEY = "verl_ext-digest"  # PNG text chunk: the digest of the image the thumbnail was drawn from
SIZE_KEY = "verl_ext-size"  # PNG text chunk: that image's width x height in px
_DIGEST = re.compile(r"[0-9a-f]{16}")  # what ``image_digest`` writes: never a path


class ThumbnailError(ValueError):
    """A thumbnail that cannot be drawn or written within its bounds (the record is written all the same)."""


def thumbnails_folder(records_dir: str | os.PathLike[str]) -> Path:
    """Where the thumbnails of the records in ``records_dir`` are."""
    return Path(records_dir) / THUMBNAILS_FOLDER


def thumbnail_path(folder: str | os.PathLike[str], digest: str) -> Path:
    """The file of ``digest``'s thumbnail in ``folder``; raises ThumbnailError for a digest that is not one
    ``image_digest`` writes (a record's digest is untrusted text: it must not name another path)."""
    if not _DIGEST.fullmatch(digest):
        raise ThumbnailError(f"{digest!r} is not an image digest (16 hex digits)")
    return Path(folder) / f"{digest}.png"


def _pil_image(image: Any) -> Any:
    """The image as a PIL image: a PIL image as it is; bytes (an encoded image), a data URL or a file path decoded."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return image
    if isinstance(image, bytes | bytearray):
        return Image.open(io.BytesIO(bytes(image)))
    if isinstance(image, str) and image.startswith("data:"):
        import base64

        return Image.open(io.BytesIO(base64.b64decode(image.partition(",")[2], validate=False)))
    if isinstance(image, str):
        return Image.open(image.removeprefix("file://"))
    raise ThumbnailError(f"cannot draw a thumbnail of a {type(image).__name__}: a PIL image, bytes or a path")


def draw_thumbnail(image: Any, digest: str, max_bytes: int = THUMBNAIL_MAX_BYTES) -> bytes:
    """A PNG of ``image`` at most ``THUMBNAIL_SIDE`` px on its long side (never enlarged) naming ``digest`` and the
    image's size; the caller's image is not changed. Raises ThumbnailError when it is over ``max_bytes`` even with a
    palette, and Pillow's errors for an image it cannot decode."""
    from PIL import Image, PngImagePlugin

    source = _pil_image(image)
    width, height = source.size
    scale = min(1.0, THUMBNAIL_SIDE / max(width, height, 1))
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    alpha = source.mode in ("RGBA", "LA", "PA") or (source.mode == "P" and "transparency" in source.info)
    # reducing_gap: a fast integer downscale first, then Lanczos from about 3x the size (same look, several times
    # faster on a screenshot)
    small = source.convert("RGBA" if alpha else "RGB").resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
    text = PngImagePlugin.PngInfo()
    text.add_text(DIGEST_KEY, digest)
    text.add_text(SIZE_KEY, f"{width}x{height}")
    for drawn in (small, small.quantize(64)):  # a palette only where the full colours are over the cap
        out = io.BytesIO()
        drawn.save(out, format="PNG", optimize=True, pnginfo=text)
        if out.tell() <= max_bytes:
            return out.getvalue()
    raise ThumbnailError(f"its {size[0]}x{size[1]} PNG is {out.tell()} bytes, over the cap of {max_bytes}")


class ThumbnailWriter:
    """Writes each distinct image's thumbnail once into ``folder`` (module docstring), at most ``max_total_bytes``
    of them in this process. The folder is created by the first write."""

    def __init__(
        self,
        folder: str | os.PathLike[str],
        *,
        max_total_bytes: int = 64 * 1024 * 1024,
        max_bytes: int = THUMBNAIL_MAX_BYTES,
    ) -> None:
        if max_total_bytes <= 0 or max_bytes <= 0:
            raise ValueError(f"thumbnails need positive byte caps, got {max_total_bytes} and {max_bytes}")
        self.folder = Path(folder)
        self.max_total_bytes = max_total_bytes
        self.max_bytes = max_bytes
        self.written_bytes = 0
        self.full = False  # the process's cap was reached: no new thumbnail is drawn
        # Digests known to have a file: a stat saved per image per rollout. Bounded; a digest that falls out is
        # only looked up on disk again.
        self._done: LruCache[str, bool] = LruCache("thumbnails written", 65536)

    def write(self, images: Mapping[str, Any]) -> list[str]:
        """Write the thumbnail of each ``digest -> image`` not written yet; returns the digests drawn now. Raises
        ThumbnailError for an image whose pixels are not its digest's (a loop that paired them wrongly: nothing is
        written for it), one over the caps or of a kind that cannot be drawn, OSError when the folder cannot be
        written, and Pillow's errors for an image it cannot decode; the other images of the call are written first."""
        drawn: list[str] = []
        errors: list[Exception] = []
        for digest, image in images.items():
            try:
                if self._write_one(digest, image):
                    drawn.append(digest)
            except Exception as exc:  # Pillow raises anything from OSError to DecompressionBombError
                errors.append(exc)
        if errors:
            raise errors[0]
        return drawn

    def _write_one(self, digest: str, image: Any) -> bool:
        path = thumbnail_path(self.folder, digest)
        if self._done.get(digest) or path.exists():
            self._done[digest] = True
            return False
        if self.full:
            return False
        actual = image_digest(image)
        if actual != digest:
            raise ThumbnailError(f"the image given for digest {digest} has digest {actual}: no thumbnail written")
        data = draw_thumbnail(image, digest, self.max_bytes)
        if self.written_bytes + len(data) > self.max_total_bytes:
            self.full = True
            log.warning(
                "verl_ext: thumbnails of this process reached %d bytes (records max_bytes); images from now on get "
                "none (the report says so). Raise verl_ext.records.max_bytes or set records.thumbnails=false",
                self.written_bytes,
            )
            return False
        self.folder.mkdir(parents=True, exist_ok=True)
        # Written whole under a temporary name, then renamed: another process writing the same digest, or a report
        # reading the folder, never sees half a file.
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f".{digest}-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.written_bytes += len(data)
        self._done[digest] = True
        return True
