"""One rollout as a token-by-token view: every token with its kind, mask, logprob and the findings over it.

Records hold ids, not text, so tokens are decoded one id at a time with the tokenizer the report was given.
Long runs of tokens with no finding or failure in them are folded so a page of several examples stays short: a
run of a few hundred tokens can be unfolded in the page; a longer one is left out of the page (its positions are
named), so a 200k-token turn costs the page a few lines, not tens of megabytes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from verl_ext.check.record import RolloutRecord
from verl_ext.report.text import Piece, pieces
from verl_ext.report.thumbnails import Thumbnail, image_spans

Decode = Callable[[Sequence[int]], str]
Thumbnails = Callable[[str], Thumbnail]  # an image's digest -> its thumbnail, as the page shows it

FOLD_MIN = 48  # runs of unremarkable tokens longer than this are folded
FOLD_KEEP = (12, 16)  # tokens left visible before and after a fold
FOLD_EMBED = 600  # a folded run up to this long is in the page (click to show); a longer one is left out
FOLD_EDGE = 8  # tokens always shown on each side of where a finding starts and ends


@dataclass(frozen=True)
class Token:
    """One token of a shown rollout, with what the page says about it."""

    position: int
    id: int
    kind: str
    mask: int
    turn: int  # the record's turn_of: engine call the token belongs to (-1: in the first prompt)
    logprob: float | None  # the engine's, on sampled tokens
    pieces: tuple[Piece, ...]
    finding: int | None = None  # number of the finding over it (defects win over allowed findings)
    defect: bool = False
    failure: str | None = None  # engine-view failure kind at this position
    drift: bool = False  # a trained token in a turn or depth bucket whose numbers drift (the numerics view)

    @property
    def title(self) -> str:
        """The token's tooltip: position, id, kind, mask, turn, logprob and finding."""
        parts = [f"position {self.position}", f"id {self.id}", self.kind, f"mask {self.mask}"]
        if self.turn >= 0:
            parts.append(f"turn {self.turn}")
        if self.logprob is not None:
            parts.append(f"logprob {self.logprob:.4f}")
        if self.finding is not None:
            parts.append(f"finding {self.finding}")
        if self.failure:
            parts.append(f"ENGINE VIEW FAILURE: {self.failure}")
        if self.drift:
            parts.append("numbers drift here (trainer vs engine logprob)")
        return " · ".join(parts)


@dataclass(frozen=True)
class Marker:
    """Where a finding starts; ``missing`` is the template's text when the stream has nothing there."""

    number: str  # "3" for finding 3, "E1" for the first engine-view failure
    cause: str
    defect: bool
    missing: tuple[Piece, ...] | None
    title: str
    failure: bool = False
    # Where an image's placeholder run starts (not a finding): the image and its thumbnail.
    image: ImageMark | None = None
    drift: bool = False  # where the numbers' drift starts (the numerics view), not a finding


@dataclass(frozen=True)
class ImageMark:
    """An image beside its placeholder run: what the record says of it and its thumbnail (None: none looked up)."""

    index: int
    length: int  # placeholder tokens
    grid: tuple[int, ...]
    digest: str
    turn: int
    thumbnail: Thumbnail | None


@dataclass
class Fold:
    """A run of unremarkable tokens folded away (kept in the page, or left out when long)."""

    tokens: list[Token] = field(default_factory=list)  # empty when the run is left out of the page
    start: int = 0  # stream positions [start, end) of the folded run
    end: int = 0
    kinds: str = ""

    @property
    def count(self) -> int:
        """How many tokens the fold hides."""
        return self.end - self.start

    @property
    def left_out(self) -> bool:
        """Whether the folded tokens are left out of the page (too long to embed)."""
        return not self.tokens


Item = Token | Marker | Fold


def token_view(
    record: RolloutRecord,
    decode: Decode,
    thumbnails: Thumbnails | None = None,
    drift: Collection[int] = (),
    drift_start: Marker | None = None,
    drift_at: int | None = None,
) -> list[Item]:
    """The record's stream as tokens, finding and failure markers, and folds (module docstring). Each token's turn
    is the record's ``turn_of``; tokens of the first prompt show none (-1). ``thumbnails``: each image's thumbnail,
    shown beside its placeholder run (None: the marks name the images without one). ``drift``: positions of the
    trained tokens whose numbers drift, coloured; ``drift_start``: a marker placed (and always shown) at position
    ``drift_at``, where the numbers' drift starts."""
    ids = record.input_ids
    n = len(ids)
    kinds = record.kinds  # one per stream token (the loader pads or cuts them to the stream)
    mask = list(record.loss_mask[:n]) + [0] * (n - len(record.loss_mask))
    first_output = record.engine_calls[0].output_start if record.engine_calls else n
    logprobs = record.sampled_logprobs
    owner, markers = _finding_markers(record, n)
    failed = _failure_markers(record, n, markers)
    images = _image_markers(record, n, markers, thumbnails)

    # Tokens near where a finding starts or ends, or where the engine view failed, are always shown; runs of
    # other tokens (inside a long finding too) are folded. Tokens are built only where shown.
    if drift_start is not None and drift_at is not None and 0 <= drift_at < n:
        markers.setdefault(drift_at, []).append(drift_start)
    loud = set(markers) | set(failed) | images
    if drift_at is not None:
        loud.update(range(max(0, drift_at - FOLD_EDGE), min(n, drift_at + FOLD_EDGE)))
    for f in record.check.findings:
        for edge in f.stream:
            loud.update(range(max(0, edge - FOLD_EDGE), min(n, edge + FOLD_EDGE)))

    def token(p: int) -> Token:
        return Token(
            position=p,
            id=ids[p],
            kind=kinds[p],
            mask=mask[p],
            turn=record.turn_of[p] if p >= first_output and p < len(record.turn_of) else -1,
            logprob=logprobs.get(p) if kinds[p] == "sampled" else None,
            pieces=tuple(pieces(decode([ids[p]]))),
            finding=owner[p][0] if p in owner else None,
            defect=owner.get(p, (0, False))[1],
            failure=failed.get(p),
            drift=p in drift,
        )

    return _folded(n, loud, markers, kinds, token)


def _finding_markers(record: RolloutRecord, n: int) -> tuple[dict[int, tuple[int, bool]], dict[int, list[Marker]]]:
    """(position -> (finding number, defect), where a defect owns a token over an allowed finding; position ->
    the markers placed before it, one per finding, at its start)."""
    owner: dict[int, tuple[int, bool]] = {}
    markers: dict[int, list[Marker]] = {}
    for number, f in enumerate(record.check.findings, 1):
        start, end = f.stream
        defect = not f.allowed
        for p in range(start, end):
            if p not in owner or (defect and not owner[p][1]):
                owner[p] = (number, defect)
        missing = tuple(pieces(f.rendered_text)) if end == start else None
        title = f"finding {number}: {f.cause} ({'defect' if defect else 'allowed'}) — {f.detail}"
        markers.setdefault(min(start, n), []).append(Marker(str(number), f.cause, defect, missing, title))
    return owner, markers


def _failure_markers(record: RolloutRecord, n: int, markers: dict[int, list[Marker]]) -> dict[int, str]:
    """Position -> the first engine-view failure's kind there; adds each failure's marker to ``markers``."""
    failed: dict[int, str] = {}
    for k, e in enumerate(record.check.engine_failures, 1):
        if e.position is None:
            continue  # a failure of the whole record (e.g. lengths): shown above the tokens only
        failed.setdefault(e.position, e.kind)
        title = f"engine-view failure: {e.kind} — {e.detail}"
        marker = Marker(f"E{k}", f"engine: {e.kind}", True, None, title, failure=True)
        markers.setdefault(min(e.position, n), []).append(marker)
    return failed


def _image_markers(
    record: RolloutRecord, n: int, markers: dict[int, list[Marker]], thumbnails: Thumbnails | None
) -> set[int]:
    """Adds a marker where each image's placeholder run starts (a record with images: its ``images`` evidence),
    naming the image, its length, grid and digest, with its thumbnail; returns those positions (always shown)."""
    out: set[int] = set()
    for span in image_spans(record):
        k, at, length, grid, digest, turn = (
            span[key] for key in ("index", "position", "length", "grid", "digest", "turn")
        )
        if 0 <= at < n:
            title = f"image {k} (before engine call {turn}): {length} placeholder tokens, grid {grid}, digest {digest}"
            mark = ImageMark(k, length, tuple(grid), digest, turn, None if thumbnails is None else thumbnails(digest))
            markers.setdefault(at, []).append(
                Marker(f"I{k}", f"image, {length} tokens", False, None, title, image=mark)
            )
            out.add(at)
    return out


def _folded(
    n: int,
    loud: set[int],
    markers: dict[int, list[Marker]],
    kinds: Sequence[str],
    token: Callable[[int], Token],
) -> list[Item]:
    """The stream in order: each loud position with its markers, and each quiet run longer than ``FOLD_MIN`` as
    ``FOLD_KEEP`` tokens either side of a fold (its tokens embedded when at most ``FOLD_EMBED``)."""
    items: list[Item] = []
    p = 0
    while p < n:
        if p in loud:
            items += markers.get(p, [])
            items.append(token(p))
            p += 1
            continue
        q = p
        while q < n and q not in loud:
            q += 1
        head, tail = FOLD_KEEP
        if q - p > FOLD_MIN:
            middle = range(p + head, q - tail)
            items += [token(x) for x in range(p, middle.start)]
            embedded = [token(x) for x in middle] if len(middle) <= FOLD_EMBED else []
            items.append(Fold(embedded, middle.start, middle.stop, "/".join(sorted(set(kinds[p + head : q - tail])))))
            items += [token(x) for x in range(middle.stop, q)]
        else:
            items += [token(x) for x in range(p, q)]
        p = q
    items += markers.get(n, [])
    return items
