"""Per-turn cost with an image and check cost with images, against text-only baselines measured in the same run.

Run from the repository root: ``PYTHONPATH=$PWD python bench/images_cost.py`` (figures: docs/performance.md#images).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "images"))  # the image tests' rollout helpers

from vl_rollouts import CALL_TEXT, TOOLS, call_message, drive, make_image  # noqa: E402

from verl_ext.check.checker import ConsistencyChecker  # noqa: E402
from verl_ext.check.image_view import ImageEvidence, check_image_view  # noqa: E402
from verl_ext.core.image_trajectory import ImageTrajectory  # noqa: E402
from verl_ext.core.images import ImageTokens, image_digest, probe_vision  # noqa: E402
from verl_ext.core.rendering import ChatRenderer  # noqa: E402
from verl_ext.core.trajectory import TokenTrajectory  # noqa: E402
from verl_ext.demo.run import shipped_tokenizers  # noqa: E402
from verl_ext.demo.vl_model import build_vl_processor  # noqa: E402
from verl_ext.telemetry.thumbnails import ThumbnailWriter  # noqa: E402


def median_ms(fn: Callable[[], Any], n: int) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def tool_turn_ms(renderer: ChatRenderer, make: Callable[[], TokenTrajectory], content: Callable[[int], Any]) -> float:
    """Median time of one tool-result append after a tool call (a fresh trajectory each time)."""
    times = []
    for k in range(30):
        t = make()
        t.start([{"role": "user", "content": "What is on the screen?"}], TOOLS)
        ids = renderer.encode(CALL_TEXT.format(region="r0"))
        t.add_sampled(ids, [-0.1] * len(ids), "stop", call_message("r0"))
        start = time.perf_counter()
        t.append_messages([{"role": "tool", "content": content(k)}])
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    processor = build_vl_processor(shipped_tokenizers()["qwen2.5"])
    r = ChatRenderer(processor.tokenizer)
    start = time.perf_counter()
    tokens = ImageTokens(probe_vision(r, processor, make_image), processor)
    print(f"probe {(time.perf_counter() - start) * 1e3:.0f} ms")

    def image(k: int) -> Any:
        return [{"type": "image", "image": make_image(224, 224, k)}, {"type": "text", "text": "screenshot 0"}]

    text = tool_turn_ms(r, lambda: TokenTrajectory(r), lambda k: "screenshot 0")
    listed = tool_turn_ms(r, lambda: TokenTrajectory(r), lambda k: [{"type": "text", "text": "screenshot 0"}])
    with_image = tool_turn_ms(r, lambda: ImageTrajectory(r, image_tokens=tokens), image)
    images = [make_image(224, 224, 50 + k) for k in range(20)]
    expand = median_ms(lambda: tokens.expand(images[0]), 20)
    digest = median_ms(lambda: image_digest(images[0]), 20)
    print(
        f"tool turn: text {text:.2f} ms (learned delta), list-content text {listed:.1f} ms (rendered), one 224x224 "
        f"image {with_image:.1f} ms ({with_image / text:.0f}x text); processor expand {expand:.1f} ms, digest "
        f"{digest:.2f} ms"
    )
    with_images = drive(r, tokens, [make_image(224, 224, 1)], [[make_image(224, 224, 10 + k)] for k in range(4)])
    text_only = drive(r, tokens, [], [[] for _ in range(4)])
    checker = ConsistencyChecker(r)
    costs = []
    for ro in (text_only, with_images):
        rollout = ro.rollout()
        costs.append(median_ms(lambda rollout=rollout: checker.check_rollout(rollout, template_view=True), 10))
        assert checker.check_rollout(rollout, template_view=True).ok
    evidence = ImageEvidence.from_json(with_images.rollout().extra["images"])
    sample = with_images.sample()
    view = median_ms(lambda: check_image_view(evidence, sample), 100)
    print(
        f"check, 5 turns, every view: text {costs[0]:.1f} ms ({len(text_only.sample().stream)} tokens), with 5 "
        f"images {costs[1]:.1f} ms ({len(sample.stream)} tokens, {costs[1] / costs[0]:.2f}x); image view {view:.2f} ms"
    )
    thumbnails(tokens)


def thumbnails(tokens: ImageTokens) -> None:
    """A thumbnail's cost (digest check, draw, write) for a new image, and for one already written (every later
    rollout holding it), against the processor's expansion of the same image."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)

    def noise(width: int, height: int) -> Any:  # the worst case for a PNG's size: every pixel random
        return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")

    for width, height, kind in ((224, 224, "flat"), (1280, 720, "flat"), (1280, 720, "noise")):
        fresh = [make_image(width, height, 100 + k) if kind == "flat" else noise(width, height) for k in range(10)]
        expand = median_ms(lambda im=fresh[0]: tokens.expand(im), 10)
        new, again, size = thumbnail_ms(fresh)
        print(
            f"thumbnail of a {kind} {width}x{height} image: new {new:.1f} ms ({new / expand:.2f}x the processor's "
            f"expansion {expand:.1f} ms), already written {again * 1e3:.1f} us, {size:.0f} bytes"
        )


def thumbnail_ms(images: list[Any]) -> tuple[float, float, float]:
    """(median ms to write a new image's thumbnail, median ms for one already written, mean bytes per file)."""
    with tempfile.TemporaryDirectory() as tmp:
        writer = ThumbnailWriter(tmp)
        pairs = iter([(image_digest(im), im) for im in images])  # digests the loop holds already
        new = median_ms(lambda: writer.write(dict([next(pairs)])), len(images))
        seen = {image_digest(images[0]): images[0]}
        again = median_ms(lambda: writer.write(seen), 100)
        size = sum(p.stat().st_size for p in Path(tmp).iterdir()) / len(images)
    return new, again, size


if __name__ == "__main__":
    main()
