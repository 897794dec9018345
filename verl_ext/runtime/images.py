"""Images in any loop: the probed image side of a processor, and the trainer sample of a trajectory with images.

- ``vision_for``: the probed image profile of a processor + the loop's template, once per process (None for a
  text-only model; a VL processor the probe cannot serve is refused with the cause);
- ``image_sample``: the trainer sample cut so that no image's placeholder run is cut in two, with the images the
  trainer gets (``multi_modal_data``: every image whose run it holds, in placeholder order), the record's
  evidence for the image view, the messages as the record holds them (images as digests) and each image by its
  digest (its thumbnail, ``verl_ext.telemetry.thumbnails``).
- ``load_processor``: a model folder's VL processor for the tools that build one themselves (the gateway,
  ``verl-ext check-template``): transformers' ``AutoProcessor``, or, where it fails for want of torchvision (which
  cannot be installed beside torch 2.13 CPU), the processor class the folder names built from its tokenizer and
  image processor with transformers' own base video processor standing in (images never touch it; the
  integration refuses videos). verl's worker builds its processor itself (``hf_processor``).
``verl_ext_tool_agent`` (``verl_ext.plugin.image_loop``) and the gateway (``verl_ext.gateway.conclude``) use the
first two.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_ext.check.image_view import image_evidence, messages_for_record
from verl_ext.check.inputs import TrainerSample, trainer_sample_from_trajectory
from verl_ext.core.bounded_cache import LruCache
from verl_ext.core.image_trajectory import ImageTrajectory
from verl_ext.core.images import ImageTokens, probe_vision
from verl_ext.core.rendering import ChatRenderer

# One entry per processor object and template, for the worker's life; the processor is kept with its entry so that
# an id reused after garbage collection is not taken for it.
_VISION: LruCache[tuple[int, str], tuple[Any, ImageTokens]] = LruCache("image profiles", 16)


MAX_IMAGE_BYTES = 20 * 2**20  # OpenAI's and Anthropic's per-image limit for inline images; tools' images too


class UnusableImage(ValueError):
    """An image the model's processor cannot read; the message says what it was and why."""


class ImageTooLarge(UnusableImage):
    """An image over Pillow's decompression-bomb limit."""


def decode_image_bytes(raw: bytes | bytearray) -> tuple[Any, str | None]:
    """The RGB Pillow image of an image file's bytes (decoded now, whole) and the format Pillow read. Raises
    ``ImageTooLarge`` over Pillow's decompression-bomb limit, ``UnusableImage`` for bytes it cannot decode."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(raw)) as opened:
            found = opened.format
            opened.load()
            return opened.convert("RGB"), found  # what the image processor converts to; the digest is of these
    except Image.DecompressionBombError as exc:
        raise ImageTooLarge(f"the image is too large to decode ({exc})") from None
    except UnidentifiedImageError:  # Pillow's own text is the repr of the BytesIO it was handed: name the bytes
        raise UnusableImage(
            f"the bytes cannot be decoded as an image: they are in no image format Pillow reads (the first bytes: "
            f"{bytes(raw[:8]).hex(' ') or 'none'}); send the bytes of a PNG, JPEG, GIF or WebP file"
        ) from None
    except (OSError, ValueError, SyntaxError) as exc:
        raise UnusableImage(f"the bytes cannot be decoded as an image ({exc}); send a whole image file") from None


def tool_image(image: Any) -> Any:
    """A tool's image as the processor reads it: a Pillow image (decoded now, so a truncated file fails here, not
    in the processor), or PNG/JPEG/... bytes or a local file path decoded to one. Raises ``UnusableImage`` naming
    the problem for anything else: another type, a URL (nothing is fetched), bytes or a file Pillow cannot decode,
    one over ``MAX_IMAGE_BYTES`` or Pillow's decompression-bomb limit."""
    from PIL import Image

    if isinstance(image, Image.Image):
        try:
            image.load()
        except Image.DecompressionBombError as exc:
            raise ImageTooLarge(f"the image is too large to decode ({exc})") from None
        except (OSError, ValueError, SyntaxError) as exc:
            raise UnusableImage(f"the image cannot be decoded ({exc})") from None
        return image
    if isinstance(image, str) and "://" in image:
        raise UnusableImage(f"{image[:60]!r} is a URL; the loop fetches no images: return the image itself")
    if isinstance(image, str | os.PathLike):
        path = Path(image)
        if not path.is_file():
            raise UnusableImage(f"{str(image)[:120]!r} is not a file")
        if path.stat().st_size > MAX_IMAGE_BYTES:
            raise UnusableImage(f"{path} is over {MAX_IMAGE_BYTES // 2**20} MiB")
        image = path.read_bytes()
    if not isinstance(image, bytes | bytearray):
        raise UnusableImage(
            f"a {type(image).__name__} is not an image; return a PIL image, the image file's bytes or a local path"
        )
    if len(image) > MAX_IMAGE_BYTES:
        raise UnusableImage(f"the image is over {MAX_IMAGE_BYTES // 2**20} MiB")
    return decode_image_bytes(image)[0]


def blank_image(width: int, height: int) -> Any:
    from PIL import Image

    return Image.new("RGB", (width, height), (127, 127, 127))


def vision_for(processor: Any, renderer: ChatRenderer) -> ImageTokens | None:
    """The image side of the loop: None when verl gives no processor with an image processor (a text-only
    model); else the probed profile with the processor, built once per processor and template."""
    if processor is None or getattr(processor, "image_processor", None) is None:
        return None
    key = (id(processor), renderer.fingerprint)

    def make() -> tuple[Any, ImageTokens]:
        return processor, ImageTokens(probe_vision(renderer, processor, blank_image), processor)

    held, tokens = _VISION.get_or_make(key, make)
    if held is not processor:  # another object under a reused id: probe this one
        _VISION.pop(key, None)
        held, tokens = _VISION.get_or_make(key, make)
    return tokens


@dataclass(frozen=True)
class ImageSample:
    """What the loop hands on for a rollout with images."""

    sample: TrainerSample
    multi_modal_data: dict[str, list[Any]] | None
    record_images: dict[str, Any]
    record_messages: list[dict[str, Any]]
    pixels: dict[str, Any]  # each image of the trajectory by its digest: the thumbnails written beside the record


def image_sample(t: ImageTrajectory, response_length: int | None) -> ImageSample:
    """The trainer sample of ``t`` cut at ``response_length`` and, where that cut falls inside an image's block,
    before the block: an image is trained on whole or not at all (verl pairs runs and images one to one). Only the
    context appended after the last engine call can cross the cut (each turn asks for what is left), so the
    engine saw every image the sample keeps."""
    sample = trainer_sample_from_trajectory(t, response_length)
    end = len(sample.stream)
    before = len(t.image_tokens.profile.before_ids)
    kept = [s for s in t.image_spans if s.position + s.length <= end]
    cut = next((s for s in t.image_spans if s.position < end < s.position + s.length), None)
    if cut is not None:
        end = max(len(sample.prompt_ids), cut.position - before)
        n = end - len(sample.prompt_ids)
        sample = dataclasses.replace(
            sample,
            response_ids=sample.response_ids[:n],
            response_mask=sample.response_mask[:n],
            response_logprobs=None if sample.response_logprobs is None else sample.response_logprobs[:n],
        )
        kept = [s for s in kept if s.position + s.length <= end]
    images = [t.images[s.index] for s in kept]
    evidence = image_evidence(t, images)
    evidence = dataclasses.replace(evidence, engine=tuple(kept))
    return ImageSample(
        sample,
        {"images": images} if images else None,
        evidence.to_json(),
        messages_for_record(t.messages, t.image_spans),
        {s.digest: t.images[s.index] for s in t.image_spans},
    )


@contextlib.contextmanager
def video_processor_stand_in() -> Iterator[Any]:
    """transformers' real ``BaseVideoProcessor`` class in the two places a processor's type check reads it, for one
    constructor call (the public name is a placeholder class when torchvision is missing); restored afterwards."""
    import transformers
    import transformers.processing_utils as pu
    import transformers.video_processing_utils as vpu

    real = vpu.BaseVideoProcessor
    saved = transformers.BaseVideoProcessor, pu.transformers_module.BaseVideoProcessor
    transformers.BaseVideoProcessor = pu.transformers_module.BaseVideoProcessor = real
    try:
        yield real
    finally:
        transformers.BaseVideoProcessor, pu.transformers_module.BaseVideoProcessor = saved


@dataclass(frozen=True)
class LoadedProcessor:
    """A folder's processor and how it was built (``how``: said in the audit and the gateway's log)."""

    processor: Any
    how: str


def load_processor(folder: str | os.PathLike[str]) -> LoadedProcessor:
    """The VL processor of ``folder`` (which holds ``preprocessor_config.json``); raises ``OptionsError`` naming the
    cause when neither way builds it."""
    from verl_ext.core.errors import OptionsError

    try:
        from transformers import AutoProcessor

        # never the folder's own code (and never transformers' interactive question about it, in a terminal)
        processor = AutoProcessor.from_pretrained(str(folder), trust_remote_code=False)
        return LoadedProcessor(processor, "AutoProcessor")
    except Exception as exc:  # transformers raises anything from ImportError to AttributeError here
        auto_error = f"{type(exc).__name__}: {exc}"
    try:
        processor = processor_from_parts(folder)
    except Exception as exc:
        raise OptionsError(
            f"the processor of {folder} cannot be built: AutoProcessor failed ({auto_error}), and so did its "
            f"classes from preprocessor_config.json ({type(exc).__name__}: {exc})"
        ) from None
    how = (
        f"{type(processor).__name__} built from its tokenizer and {type(processor.image_processor).__name__}, a video "
        f"processor standing in (AutoProcessor: {auto_error[:80]})"
    )
    return LoadedProcessor(processor, how)


def processor_from_parts(folder: str | os.PathLike[str]) -> Any:
    """The processor class ``folder``'s ``preprocessor_config.json`` names, built from the folder's tokenizer and
    image processor with transformers' base video processor standing in (torchvision missing). Raises what
    transformers raises, or ``OptionsError`` when transformers has no such class."""
    import transformers

    from verl_ext.core.errors import OptionsError

    settings = json.loads((Path(folder) / "preprocessor_config.json").read_text())
    name = str(settings.get("image_processor_type", ""))
    image_cls = getattr(transformers, name, None) or getattr(transformers, name + "Pil", None)
    processor_cls = getattr(transformers, str(settings.get("processor_class", "")), None)
    if image_cls is None or processor_cls is None:
        raise OptionsError(f"transformers has no {name!r} or {settings.get('processor_class')!r}")
    image_processor = image_cls.from_pretrained(str(folder))
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    with video_processor_stand_in() as video_cls:
        return processor_cls(
            image_processor=image_processor,
            tokenizer=tokenizer,
            video_processor=video_cls(),
            chat_template=tokenizer.chat_template,
        )
