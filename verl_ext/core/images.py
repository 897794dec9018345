"""Images in the token stream: what a vision-language processor and chat template do with an image, probed once.

A VL template writes each image block as a short text (Qwen2.5-VL: ``<|vision_start|><|image_pad|><|vision_end|>``);
the processor then expands the placeholder token into as many copies as the image's grid gives, and the engine and
the trainer both need those expanded ids. Nothing here is written per model family: ``probe_vision`` renders a
message with and without an image block, runs the processor on the result for images of two sizes, and derives

- the **placeholder** (the one token the processor repeats), and the **boundary** tokens the template writes
  around it;
- the **grid key** (the processor output with one row per image whose product tracks the expansion) and the
  **expansion rule**: placeholders per image = product(grid row) / divisor, the divisor read from the probe.

A template or processor the probe cannot serve (the template ignores image blocks, the processor does not expand,
the count does not follow a grid) is refused with a ``TemplateError`` naming the cause.

The processor is the integration's object (transformers' ``ProcessorMixin``); the core only calls it. It is asked
for NumPy arrays (``return_tensors="np"``), so this module imports neither torch nor NumPy: transformers' image
processors themselves need Pillow and NumPy, which come with transformers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from verl_ext.core.errors import TemplateError
from verl_ext.core.rendering import ChatRenderer, Message

# Content-part types that carry an image, as OpenAI-format messages and verl's tool loop write them.
IMAGE_PART_TYPES = ("image", "image_url")
_TEXT = "QXIMGPROBEQX"


class VisionProcessor(Protocol):
    """What the core asks of a VL processor: transformers' ``ProcessorMixin`` call, one text, a list of images."""

    def __call__(self, *, text: list[str], images: list[Any], return_tensors: str) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class VisionProfile:
    """How images become tokens for one processor + template (``probe_vision``)."""

    placeholder_id: int  # the token the processor repeats per image (Qwen: <|image_pad|>)
    before_ids: tuple[int, ...]  # what the template writes right before the placeholder (<|vision_start|>)
    after_ids: tuple[int, ...]  # what it writes right after (<|vision_end|>)
    image_text: str  # the template's whole text for one image block
    grid_key: str  # the processor output with one grid row per image (Qwen: image_grid_thw)
    divisor: int  # placeholders per image = product(grid row) // divisor (Qwen: merge_size ** 2)

    def expected_length(self, grid: Sequence[int]) -> int:
        """The number of placeholder tokens an image with this grid row expands to."""
        return _product(grid) // self.divisor

    def to_dict(self) -> dict[str, Any]:
        return {
            "placeholder_id": self.placeholder_id,
            "before_ids": list(self.before_ids),
            "after_ids": list(self.after_ids),
            "image_text": self.image_text,
            "grid_key": self.grid_key,
            "divisor": self.divisor,
        }


@dataclass(frozen=True)
class ExpandedImage:
    """One image as the processor expands it: its grid row and its placeholder count."""

    grid: tuple[int, ...]
    length: int


def image_digest(image: Any) -> str:
    """A digest of an image's pixels (first 16 hex digits of sha256 over mode, size and raw bytes): equal for the
    same picture however it was passed around. Bytes and strings (a path, a data URL) are hashed as given."""
    h = hashlib.sha256()
    if isinstance(image, bytes | bytearray):
        h.update(b"bytes:" + bytes(image))
    elif isinstance(image, str):
        h.update(b"str:" + image.encode())
    elif hasattr(image, "tobytes") and hasattr(image, "size") and hasattr(image, "mode"):
        h.update(f"{image.mode}:{tuple(image.size)}:".encode())
        h.update(image.tobytes())
    else:
        raise TypeError(f"cannot digest an image of type {type(image).__name__}: pass a PIL image, bytes or a path")
    return h.hexdigest()[:16]


def part_image(part: Any) -> Any | None:
    """The image a content part carries (``{"type": "image", "image": ...}`` as verl writes it, or an OpenAI
    ``{"type": "image_url", "image_url": {"url": ...}}``), or None for any other part."""
    if not isinstance(part, Mapping) or part.get("type") not in IMAGE_PART_TYPES:
        return None
    if part.get("type") == "image":
        return part.get("image")
    url = part.get("image_url")
    return url.get("url") if isinstance(url, Mapping) else url


def images_in(messages: Sequence[Message]) -> list[Any]:
    """The images of ``messages``, in the order the template renders them (message order, then content order)."""
    found: list[Any] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            found += [img for img in map(part_image, content) if img is not None]
    return found


def placeholder_runs(stream: Sequence[int], placeholder_id: int) -> list[tuple[int, int]]:
    """(position, length) of each run of ``placeholder_id`` in ``stream``, in order."""
    runs: list[tuple[int, int]] = []
    k, n = 0, len(stream)
    while k < n:
        if stream[k] != placeholder_id:
            k += 1
            continue
        start = k
        while k < n and stream[k] == placeholder_id:
            k += 1
        runs.append((start, k - start))
    return runs


def has_images(messages: Sequence[Message]) -> bool:
    return bool(images_in(messages))


class ImageTokens:
    """Expands each image's placeholder exactly as the processor does (the processor's own ids for one image
    block, not a formula), and checks the count against the profile's grid rule."""

    def __init__(self, profile: VisionProfile, processor: VisionProcessor) -> None:
        self.profile = profile
        self.processor = processor

    def expand(self, image: Any) -> ExpandedImage:
        """The grid row and placeholder count the processor gives ``image``."""
        out = self.processor(text=[self.profile.image_text], images=[image], return_tensors="np")
        ids = _row(out["input_ids"])
        length = sum(1 for i in ids if i == self.profile.placeholder_id)
        grid = tuple(int(v) for v in _rows(out[self.profile.grid_key])[0])
        if length != self.profile.expected_length(grid):
            raise TemplateError(
                f"the processor expanded an image with grid {list(grid)} into {length} placeholders where the "
                f"probed rule gives {self.profile.expected_length(grid)}: its settings changed since the probe; "
                "probe again with the processor the rollout uses"
            )
        return ExpandedImage(grid, length)


def probe_vision(renderer: ChatRenderer, processor: VisionProcessor, make_image: Any) -> VisionProfile:
    """Derive the ``VisionProfile`` of ``renderer``'s template and ``processor``; ``make_image(width, height)``
    returns a test image (the integration passes a PIL constructor). Refuses with the cause what it cannot serve."""
    tpl = renderer.template_source
    plain = [{"role": "user", "content": [{"type": "text", "text": _TEXT}]}]
    one = [
        {"role": "user", "content": [{"type": "image", "image": make_image(56, 56)}, {"type": "text", "text": _TEXT}]}
    ]
    try:
        text_plain = renderer.render_text(plain, add_generation_prompt=True)
        text_one = renderer.render_text(one, add_generation_prompt=True)
    except TemplateError as exc:
        raise TemplateError(f"{tpl} cannot render list content with an image block: {exc}; use a VL template") from exc
    image_text = _inserted(text_plain, text_one)
    if not image_text:
        raise TemplateError(
            f"{tpl} renders nothing for an image block: it is a text-only template; pass the model's VL chat template"
        )
    rendered = list(renderer.encode(text_one))
    samples = []
    for size in ((56, 56), (56, 112), (112, 84)):
        img = make_image(*size)
        out = processor(text=[text_one], images=[img], return_tensors="np")
        samples.append((size, _row(out["input_ids"]), out))
    placeholder, before, after = _placeholder(renderer, rendered, samples[0][1], image_text, tpl)
    counts = [sum(1 for i in ids if i == placeholder) for _, ids, _ in samples]
    if len(set(counts)) == 1:
        raise TemplateError(
            f"the processor expands an image to {counts[0]} placeholders whatever its size: a fixed-count family "
            "(no grid) is not supported; verl_ext derives each image's span from its grid"
        )
    grid_key, divisor = _grid_rule(samples, counts)
    return VisionProfile(placeholder, before, after, image_text, grid_key, divisor)


def _inserted(plain: str, with_image: str) -> str:
    """The text ``with_image`` holds where ``plain`` does not (the template's text for one image block)."""
    start = 0
    while start < min(len(plain), len(with_image)) and plain[start] == with_image[start]:
        start += 1
    end = 0
    while end < min(len(plain), len(with_image)) - start and plain[-1 - end] == with_image[-1 - end]:
        end += 1
    return with_image[start : len(with_image) - end]


def _placeholder(
    renderer: ChatRenderer, rendered: list[int], processed: list[int], image_text: str, tpl: str
) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    """(placeholder id, ids before it, ids after it) in the image block's ids: the one token the processor repeats."""
    lead = 0
    while lead < min(len(rendered), len(processed)) and rendered[lead] == processed[lead]:
        lead += 1
    tail = 0
    while tail < min(len(rendered), len(processed)) - lead and rendered[-1 - tail] == processed[-1 - tail]:
        tail += 1
    was, now = rendered[lead : len(rendered) - tail], processed[lead : len(processed) - tail]
    if not was and not now:
        raise TemplateError(
            f"the processor leaves {tpl}'s image block {image_text!r} as the template wrote it: it does not expand "
            "images into tokens, so the engine and the trainer would disagree on the ids; not supported"
        )
    # The run may start with copies of the placeholder already in the rendered text (one pad): widen to it.
    while lead > 0 and now and rendered[lead - 1] == now[0]:
        lead -= 1
        was, now = [rendered[lead]] + was, [processed[lead]] + now
    if len(set(now)) != 1 or (was and set(was) != set(now)):
        raise TemplateError(
            f"the processor rewrites {tpl}'s image block into {renderer.decode(now)[:80]!r}, not a run of one "
            "repeated placeholder token: not supported"
        )
    placeholder = now[0]
    block = list(renderer.encode(image_text))
    if placeholder not in block:
        raise TemplateError(f"the placeholder the processor expands is not in {tpl}'s image block {image_text!r}")
    k = block.index(placeholder)
    j = k
    while j < len(block) and block[j] == placeholder:
        j += 1
    return placeholder, tuple(block[:k]), tuple(block[j:])


def _grid_rule(
    samples: list[tuple[tuple[int, int], list[int], Mapping[str, Any]]], counts: list[int]
) -> tuple[str, int]:
    """(the output key whose one row per image gives the count, the divisor): the same divisor for every size."""
    keys = sorted(k for k in samples[0][2] if k not in ("input_ids", "attention_mask"))
    for key in keys:
        try:
            rows = [_rows(out[key]) for _, _, out in samples]
        except (TypeError, ValueError, KeyError):
            continue
        if not all(len(r) == 1 and len(r[0]) >= 2 for r in rows):
            continue
        products = [_product(r[0]) for r in rows]
        if all(p % c == 0 for p, c in zip(products, counts, strict=True)):
            divisors = {p // c for p, c in zip(products, counts, strict=True)}
            if len(divisors) == 1:
                return key, divisors.pop()
    raise TemplateError(
        f"no processor output ({', '.join(keys)}) is a per-image grid whose product follows the placeholder count "
        f"{counts}: the expansion rule cannot be derived; not supported"
    )


def _rows(value: Any) -> list[list[int]]:
    rows = value.tolist() if hasattr(value, "tolist") else value
    if not isinstance(rows, list) or not all(isinstance(r, list) and all(isinstance(v, int) for v in r) for r in rows):
        raise ValueError("not a list of integer rows")
    return rows


def _row(value: Any) -> list[int]:
    rows = value.tolist() if hasattr(value, "tolist") else value
    return [int(i) for i in (rows[0] if rows and isinstance(rows[0], list) else rows)]


def _product(values: Sequence[int]) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out
