"""Image view: the images the trainer receives, and their token spans, are the ones the engine was given.

The engine was given each image as a run of placeholder tokens the processor expanded from the image's grid, and
the image itself, in placeholder order. verl's trainer pairs the k-th placeholder run of its stream with the k-th
image it receives (``get_rope_index``, the embedding merge): a dropped, swapped or mis-expanded image shifts every
position after it, silently when the totals still match. Per image, the view checks that

- the trainer receives the engine's images, in the engine's order (a digest of each image's pixels);
- its placeholder run in the trainer's stream sits where the engine's prompt put it and is as long as the grid of
  the image the trainer receives implies;
- none of its tokens is trained (mask 0).

And per engine call, from the call's own record of the images it was given (``EngineCall.image_digests``: the
digests of the list the loop passed as ``image_data``), that it was given exactly the images whose placeholder runs
its prompt holds (the spans before the prompt's end), in order: an engine handed another image, one more or fewer,
or the right ones in another order reads every placeholder run after the first wrong one against the wrong pixels,
and an engine that does not refuse a count mismatch (SGLang's legacy path) says nothing. A call without that record
(a loop or a record from before it was kept) is not compared, and the view says so (``ImageView.unchecked``)
instead of passing it.

Every failure is an ``EngineFailure`` (a bug, never allowed). The view reads plain data (``ImageEvidence``): the
loop computes the digests and grids with the processor; this module imports the token core only.
"""

from __future__ import annotations

import bisect
import copy
import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.check.findings import EngineFailure, FailureKind
from verl_ext.check.inputs import TrainerSample
from verl_ext.core.image_trajectory import ImageSpan, ImageTrajectory
from verl_ext.core.images import IMAGE_PART_TYPES, image_digest, part_image, placeholder_runs
from verl_ext.core.rendering import ChatRenderer, Message, Rendered


@dataclass(frozen=True)
class TrainerImage:
    """One image as handed to the trainer: its pixels' digest and the placeholder count its grid implies."""

    digest: str
    grid: tuple[int, ...]
    expected_length: int

    def to_dict(self) -> dict[str, Any]:
        return {"digest": self.digest, "grid": list(self.grid), "expected_length": self.expected_length}


@dataclass(frozen=True)
class ImageEvidence:
    """What the image view compares: the placeholder id, the engine's image spans (where its prompts held each
    image, from the trajectory that built them) and the trainer's images in the order it receives them."""

    placeholder_id: int
    engine: tuple[ImageSpan, ...]
    trainer: tuple[TrainerImage, ...]

    def to_json(self) -> dict[str, Any]:
        """The record's ``images`` object: per image its span, grid and digest on each side."""
        return {
            "placeholder_id": self.placeholder_id,
            "engine": [s.to_dict() for s in self.engine],
            "trainer": [t.to_dict() for t in self.trainer],
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ImageEvidence:
        return cls(
            int(obj["placeholder_id"]),
            tuple(ImageSpan.from_dict(s) for s in obj["engine"]),
            tuple(
                TrainerImage(str(t["digest"]), tuple(int(v) for v in t["grid"]), int(t["expected_length"]))
                for t in obj["trainer"]
            ),
        )


def check_image_view(evidence: ImageEvidence, sample: TrainerSample) -> tuple[EngineFailure, ...]:
    """The image view's failures for one rollout (empty: the trainer's images and spans are the engine's)."""
    failures: list[EngineFailure] = []
    engine, trainer = evidence.engine, evidence.trainer
    failures += _order_failures(engine, trainer)
    stream = sample.stream
    runs = placeholder_runs(stream, evidence.placeholder_id)
    mask = (0,) * len(sample.prompt_ids) + tuple(sample.response_mask)
    if len(runs) != len(engine):
        at = _first_unmatched(engine, runs)
        failures.append(
            EngineFailure(
                FailureKind.IMAGE_DROPPED if len(runs) < len(engine) else FailureKind.IMAGE_SPAN,
                None if at is None else engine[at].turn if at < len(engine) else None,
                None if at is None else (engine[at].position if at < len(engine) else runs[at][0]),
                f"the trainer's stream holds {len(runs)} image placeholder runs where the engine's prompts held "
                f"{len(engine)} images",
            )
        )
    for k, (span, run) in enumerate(zip(engine, runs, strict=False)):
        if run != (span.position, span.length):
            failures.append(
                EngineFailure(
                    FailureKind.IMAGE_SPAN,
                    span.turn,
                    run[0],
                    f"image {k}: the trainer's placeholder run is at {run[0]} ({run[1]} tokens), the engine's was at "
                    f"{span.position} ({span.length} tokens)",
                )
            )
        if k < len(trainer) and run[1] != trainer[k].expected_length:
            failures.append(
                EngineFailure(
                    FailureKind.IMAGE_EXPANSION,
                    span.turn,
                    run[0],
                    f"image {k}: its placeholder run has {run[1]} tokens where its grid {list(trainer[k].grid)} "
                    f"implies {trainer[k].expected_length}",
                )
            )
        trained = [p for p in range(run[0], run[0] + run[1]) if p < len(mask) and mask[p]]
        if trained:
            failures.append(
                EngineFailure(
                    FailureKind.IMAGE_TRAINED,
                    span.turn,
                    trained[0],
                    f"image {k}: {len(trained)} of its {run[1]} placeholder tokens have loss mask 1 (image tokens "
                    "are never sampled: mask 0)",
                )
            )
    return tuple(failures)


def _order_failures(engine: Sequence[ImageSpan], trainer: Sequence[TrainerImage]) -> list[EngineFailure]:
    """The trainer's images against the engine's, by digest: one missing, added, or out of order."""
    want, got = [s.digest for s in engine], [t.digest for t in trainer]
    if want == got:
        return []
    missing = [k for k, d in enumerate(want) if d not in got]
    if missing:
        k = missing[0]
        return [
            EngineFailure(
                FailureKind.IMAGE_DROPPED,
                engine[k].turn,
                engine[k].position,
                f"the trainer receives {len(got)} images, the engine was given {len(want)}: image {k} "
                f"(digest {want[k]}) is not among them",
            )
        ]
    if sorted(want) == sorted(got):
        k = next(i for i, (a, b) in enumerate(zip(want, got, strict=True)) if a != b)
        return [
            EngineFailure(
                FailureKind.IMAGE_ORDER,
                engine[k].turn,
                engine[k].position,
                f"the trainer's image {k} (digest {got[k]}) is not the engine's image {k} (digest {want[k]}): "
                "the images are out of placeholder order",
            )
        ]
    extra = next(k for k, d in enumerate(got) if d not in want or got.count(d) > want.count(d))
    return [
        EngineFailure(
            FailureKind.IMAGE_SPAN,
            None,
            None,
            f"the trainer's image {extra} (digest {got[extra]}) was never given to the engine",
        )
    ]


def _first_unmatched(engine: Sequence[ImageSpan], runs: Sequence[tuple[int, int]]) -> int | None:
    """The index of the first engine image whose span has no run at its place."""
    for k, span in enumerate(engine):
        if k >= len(runs) or runs[k] != (span.position, span.length):
            return k
    return len(engine) if len(runs) > len(engine) else None


# Per engine call: its prompt length and the digests of the images it was given, in order (None: not recorded), as
# ``engine_call_images`` (live calls) and ``recorded_call_images`` (a record's) read them.
CallImages = Iterable[tuple[int, tuple[str, ...] | None]]


def engine_image_failures(spans: Sequence[ImageSpan], calls: CallImages) -> tuple[tuple[EngineFailure, ...], int, int]:
    """Per call, its images against the images whose placeholder runs its prompt holds (``spans`` whose run ends at
    or before the prompt's end, in position order): the first difference, named with the call, the image's index
    and both digests. Also returns how many calls were compared and how many hold no record of their images."""
    ordered = sorted(spans, key=lambda s: s.position)
    ends = [s.position + s.length for s in ordered]
    failures: list[EngineFailure] = []
    compared = unrecorded = 0
    for k, (prompt_length, given) in enumerate(calls):
        if given is None:
            unrecorded += 1
            continue
        compared += 1
        held = ordered[: bisect.bisect_right(ends, prompt_length)]
        want = [s.digest for s in held]
        if list(given) == want:
            continue
        i = next((j for j, (a, b) in enumerate(zip(given, want, strict=False)) if a != b), min(len(given), len(want)))
        counts = f"engine call {k} was given {len(given)} image(s) where its prompt holds {len(want)} image run(s)"
        if i < len(given) and i < len(want):
            what = f"its image {i} is not its prompt's image {i}"
        elif i < len(want):
            what = f"its prompt's image {i} was not given"
        else:
            what = f"its image {i} has no placeholder run in its prompt"
        engine = given[i] if i < len(given) else "none"
        prompt = want[i] if i < len(want) else "none"
        failures.append(
            EngineFailure(
                FailureKind.IMAGE_ENGINE_MISMATCH,
                k,
                held[i].position if i < len(held) else None,
                f"{counts}: {what} (image {i}: engine call's digest {engine}, prompt's digest {prompt})",
            )
        )
    return tuple(failures), compared, unrecorded


@dataclass(frozen=True)
class ImageView:
    """The image view's result for one rollout: its failures, and why it could not compare some engine calls'
    images ("" when it compared every call's, or the rollout has no image evidence)."""

    failures: tuple[EngineFailure, ...] = ()
    unchecked: str = ""


def rollout_image_view(extra: Mapping[str, Any], sample: TrainerSample, calls: CallImages) -> ImageView:
    """The image view of a rollout whose record extras hold ``images`` (``ImageEvidence.to_json``), with each engine
    call's record of its images (``calls``); empty without ``images``."""
    obj = extra.get("images")
    if obj is None:
        return ImageView()
    evidence = ImageEvidence.from_json(obj)
    per_call, compared, unrecorded = engine_image_failures(evidence.engine, calls)
    unchecked = ""
    if unrecorded:
        unchecked = (
            f"no per-call evidence: {unrecorded} of {compared + unrecorded} engine call(s) hold no record of the "
            "images they were given (a loop, or a record, from before it was kept), so which images those calls "
            "were given is not checked; the trainer's images are compared with the trajectory's image spans only"
        )
    return ImageView(check_image_view(evidence, sample) + per_call, unchecked)


class _ImageExpandingRenderer(ChatRenderer):
    """A renderer whose ``render`` expands each image block's placeholder to the count the record's message part
    holds (``"tokens"``), as the processor expanded it in the rollout: the template view then compares the stream
    with what the template and processor together write."""

    image_placeholder: int = -1

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        escape: bool | None = None,
    ) -> Rendered:
        out = super().render(messages, tools, add_generation_prompt, escape)
        lengths = [p.get("tokens") for m in messages for p in _parts(m) if _image_part(p)]
        runs = placeholder_runs(out.ids, self.image_placeholder)
        if not runs or len(runs) != len(lengths) or not all(isinstance(n, int) for n in lengths):
            return out  # not the record's messages: rendered as the template writes them
        ids: list[int] = []
        done = 0
        for (start, length), n in zip(runs, lengths, strict=True):
            ids += out.ids[done:start]
            ids += [self.image_placeholder] * n
            done = start + length
        ids += out.ids[done:]
        return dataclasses.replace(out, ids=tuple(ids))


def expanding_images(renderer: ChatRenderer, extra: Mapping[str, Any]) -> ChatRenderer:
    """``renderer`` for the template view of a rollout: for one with images (record extras ``images``), a copy that
    renders each image block expanded as the record's messages say; otherwise ``renderer`` itself."""
    obj = extra.get("images")
    if obj is None:
        return renderer
    clone = copy.copy(renderer)
    clone.__class__ = _ImageExpandingRenderer
    clone.image_placeholder = int(obj["placeholder_id"])  # type: ignore[attr-defined]
    return clone


def _image_part(part: Any) -> bool:
    return isinstance(part, Mapping) and part.get("type") in IMAGE_PART_TYPES


def _parts(message: Mapping[str, Any]) -> list[Any]:
    content = message.get("content")
    return content if isinstance(content, list) else []


def image_evidence(trajectory: ImageTrajectory, trainer_images: Sequence[Any]) -> ImageEvidence:
    """The evidence for a rollout: the trajectory's image spans (where the engine's prompts held each image) and
    ``trainer_images`` (what the loop hands the trainer), each digested and expanded with the trajectory's
    processor (an image the engine was given is expanded once: its grid is read from its span)."""
    tokens = trajectory.image_tokens
    known = {s.digest: s.grid for s in trajectory.image_spans}
    trainer = []
    for image in trainer_images:
        digest = image_digest(image)
        grid = known.get(digest)
        if grid is None:
            grid = tokens.expand(image).grid
        trainer.append(TrainerImage(digest, grid, tokens.profile.expected_length(grid)))
    return ImageEvidence(tokens.profile.placeholder_id, tuple(trajectory.image_spans), tuple(trainer))


def messages_for_record(messages: Sequence[Mapping[str, Any]], spans: Sequence[ImageSpan]) -> list[dict[str, Any]]:
    """``messages`` with each image part replaced by ``{"type": "image", "digest": ..., "tokens": n}`` (its span in
    ``spans``, which lists the messages' images in order): a record line is JSON, the template still renders the
    part as an image block, and the check's template view expands it to ``n`` placeholders."""
    found = iter(spans)
    out = []
    for message in messages:
        if any(part_image(p) is not None for p in _parts(message)):
            parts = []
            for p in _parts(message):
                if part_image(p) is None:
                    parts.append(p)
                    continue
                span = next(found, None)
                digest = image_digest(part_image(p))
                parts.append({"type": "image", "digest": digest, "tokens": None if span is None else span.length})
            message = {**message, "content": parts}
        out.append(dict(message))
    return out


@dataclass(frozen=True)
class ImageReplay:
    """How a record's images replay without their pixels (records hold digests, never image bytes): ``count``
    image parts in its messages; ``expanded`` when every part holds the placeholder count the processor gave it
    and the record holds the image view's evidence, so each image block replays at that count (the recorded
    stream is reproduced); otherwise the template's own text for each block is replayed and the stream cannot be
    compared at the images. ``note`` says which, in words."""

    count: int
    expanded: bool
    note: str

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "expanded": self.expanded, "note": self.note}


def image_replay(
    messages: Sequence[Mapping[str, Any]], extra: Mapping[str, Any], engine_calls: Sequence[Any] = ()
) -> ImageReplay | None:
    """What replay can do with the images of a record's ``messages`` (``extra``: the record's extras;
    ``engine_calls``: its ``RecordedCall``s, whose ``images`` say what each call was given); None for a record
    without image parts."""
    lengths = [p.get("tokens") for m in messages for p in _parts(m) if _image_part(p)]
    if not lengths:
        return None
    n = len(lengths)
    unrecorded = sum(1 for c in engine_calls if getattr(c, "images", None) is None)
    per_call = (
        f"; {unrecorded} of {len(engine_calls)} engine call(s) hold no record of the images they were given (a "
        "record from before schema version 4): the image view had no per-call evidence for them"
        if unrecorded
        else ""
    )
    if extra.get("images") is not None and all(isinstance(k, int) and k > 0 for k in lengths):
        return ImageReplay(
            n,
            True,
            f"{n} image(s) replayed at the placeholder counts the record holds ({', '.join(map(str, lengths))}); the "
            "record holds digests, not pixels, so no image was re-expanded by the processor" + per_call,
        )
    missing = sum(1 for k in lengths if not isinstance(k, int) or k <= 0)
    why = (
        f"{missing} of {n} image part(s) give no placeholder count"
        if missing
        else "the record holds no image evidence ('images')"
    )
    return ImageReplay(
        n,
        False,
        f"{why}, and the record holds no pixels: each image block is replayed as the template writes it, not as the "
        "processor expanded it, so the replayed stream is not compared with the recorded one" + per_call,
    )


def replay_renderer(renderer: ChatRenderer, images: ImageReplay | None, extra: Mapping[str, Any]) -> ChatRenderer:
    """The renderer replay uses: image blocks expanded to the record's counts where ``images`` says it can."""
    return expanding_images(renderer, extra) if images is not None and images.expanded else renderer
