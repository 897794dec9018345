"""Images in gateway requests: decoded once when a message is read, refused with a 400 naming the field otherwise.

The three request shapes carry an image differently (chat completions: an ``image_url`` part with a data URL;
Anthropic: an ``image`` block with a base64 ``source``; Responses: an ``input_image`` part with a data URL); each
reader turns it into the one part the token core renders, ``{"type": "image", "image": <PIL image>, "digest": d}``
(``digest``: ``verl_ext.core.images.image_digest`` of its pixels, what history matching and the records use).

Only inline images are served. The gateway fetches nothing: it has no network policy (which hosts, how long, how
large), and a harness replaying a rollout must get the same pixels, so an ``http(s)`` URL, an Anthropic ``url``
source or a file id is a 400 naming the field, asking for a data URL. Bad input is a 400 each: not base64, not an
image format served (PNG, JPEG, GIF, WebP: what the model's image processor reads), undecodable bytes, over
``MAX_IMAGE_BYTES`` or over Pillow's decompression-bomb limit. A served model without an image side (a text-only
model, or a processor transformers could not build) refuses any image with a 400 naming that cause
(``TextOnlyTrajectory``).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from typing import Any

from verl_ext.core.images import image_digest, part_image
from verl_ext.core.prompt_ids import PromptIds
from verl_ext.core.rendering import ChatRenderer, Message
from verl_ext.core.template_profile import TemplateProfile
from verl_ext.core.trajectory import TokenTrajectory
from verl_ext.gateway.errors import bad_request
from verl_ext.runtime.images import MAX_IMAGE_BYTES, ImageTooLarge, UnusableImage, decode_image_bytes

# media type -> the Pillow format name its bytes must decode as
SERVED_FORMATS = {
    "image/png": "PNG",
    "image/jpeg": "JPEG",
    "image/jpg": "JPEG",
    "image/gif": "GIF",
    "image/webp": "WEBP",
}
_INLINE = "send the image inline as a data URL (data:image/png;base64,...)"


def image_part(image: Any) -> dict[str, Any]:
    """The normalized part of a decoded image."""
    return {"type": "image", "image": image, "digest": image_digest(image)}


def is_decoded_image_part(part: Any) -> bool:
    """A part a reader already decoded (a JSON body cannot hold a Pillow image, so a client cannot forge one)."""
    return isinstance(part, Mapping) and part.get("type") == "image" and hasattr(part.get("image"), "tobytes")


def image_from_url(url: Any, where: str) -> Any:
    """The image a data URL holds (chat completions' ``image_url.url``, Responses' ``image_url``)."""
    if not isinstance(url, str) or not url:
        raise bad_request(where, f"{where} must be a data URL string ({_INLINE})")
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme in ("http", "https", "ftp", "file"):
        raise bad_request(
            where,
            f"{where} is a {scheme} URL: the gateway fetches no images (it has no network policy, and a rollout's "
            f"pixels must be the ones the client sent); {_INLINE}",
            "unsupported",
        )
    if scheme != "data":
        raise bad_request(where, f"{where} is not a data URL ({url[:40]!r}...); {_INLINE}")
    head, sep, data = url[5:].partition(",")
    fields = head.split(";")
    if not sep or "base64" not in [f.lower() for f in fields[1:]]:
        raise bad_request(where, f"{where}: only base64 data URLs are served ({_INLINE})")
    return decode_image(fields[0], data, where)


def decode_image(media_type: Any, data: Any, where: str) -> Any:
    """The RGB Pillow image of base64 ``data`` declared as ``media_type`` (400 naming ``where`` when it is not
    one the gateway serves)."""
    kind = str(media_type).strip().lower()
    if kind not in SERVED_FORMATS:
        raise bad_request(
            where,
            f"{where}: media type {media_type!r} is not served; send {', '.join(sorted(set(SERVED_FORMATS)))} "
            "(what the model's image processor reads)",
            "unsupported",
        )
    if not isinstance(data, str) or not data:
        raise bad_request(where, f"{where}: the image data must be a non-empty base64 string")
    if len(data) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise bad_request(where, f"{where}: the image is over {MAX_IMAGE_BYTES // 2**20} MiB; send a smaller one")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise bad_request(
            where, f"{where}: the image data is not valid base64 ({exc}); send the image file's bytes base64-encoded"
        ) from None
    try:
        image, found = decode_image_bytes(raw)
    except ImageTooLarge as exc:
        raise bad_request(where, f"{where}: {exc}; send a smaller one") from None
    except UnusableImage as exc:
        raise bad_request(where, f"{where}: {exc}") from None
    if found != SERVED_FORMATS[kind]:
        raise bad_request(where, f"{where}: declared {kind} but the bytes are {found or 'of no known format'}")
    return image


def joined(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A message's content from its parts: text parts as one string; with an image, the parts as they are."""
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def content_key(content: Any) -> str:
    """The text a message's content is matched by: its text, each image as its digest (never its pixels)."""
    if not isinstance(content, list):
        return content or ""
    out = []
    for part in content:
        if part_image(part) is not None:
            out.append(f"\x00image:{part.get('digest') or image_digest(part_image(part))}\x00")
        else:
            out.append(str(part.get("text", "")))
    return "".join(out)


class TextOnlyTrajectory(TokenTrajectory):
    """The gateway's trajectory for a served model without an image side: a message holding an image is a 400
    naming the part and ``cause``, before anything is rendered (never an image dropped by a text template)."""

    def __init__(self, renderer: ChatRenderer, profile: TemplateProfile, cause: str) -> None:
        super().__init__(renderer, profile)
        self.cause = cause

    def start(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None) -> PromptIds:
        self._refuse(messages, 0)
        return super().start(messages, tools)

    def append_messages(self, messages: Sequence[Message]) -> PromptIds:
        self._refuse(messages, len(self.messages))
        return super().append_messages(messages)

    def _refuse(self, messages: Sequence[Message], first: int) -> None:
        for i, message in enumerate(messages):
            content = message.get("content")
            for k, part in enumerate(content if isinstance(content, list) else ()):
                if part_image(part) is not None:
                    where = f"messages[{first + i}].content[{k}]"
                    raise bad_request(where, f"{where} is an image, but {self.cause}; send text only", "unsupported")
