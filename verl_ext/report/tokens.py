"""One rollout as a token-by-token view: every token with its kind, mask, logprob and the findings over it.

Records hold ids, not text, so tokens are decoded one id at a time with the tokenizer the report was given.
Long runs of tokens with no finding or failure in them are folded so a page of several examples stays short: a
run of a few hundred tokens can be unfolded in the page; a longer one is left out of the page (its positions are
named), so a 200k-token turn costs the page a few lines, not tens of megabytes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_ext.report.text import Piece, pieces

Decode = Callable[[Sequence[int]], str]

FOLD_MIN = 48  # runs of unremarkable tokens longer than this are folded
FOLD_KEEP = (12, 16)  # tokens left visible before and after a fold
FOLD_EMBED = 600  # a folded run up to this long is in the page (click to show); a longer one is left out
FOLD_EDGE = 8  # tokens always shown on each side of where a finding starts and ends


@dataclass(frozen=True)
class Token:
    position: int
    id: int
    kind: str
    mask: int
    turn: int  # engine call whose prompt or output holds it (-1: before the first call's prompt end)
    logprob: float | None  # the engine's, on sampled tokens
    pieces: tuple[Piece, ...]
    finding: int | None = None  # number of the finding over it (defects win over allowed findings)
    defect: bool = False
    failure: str | None = None  # engine-view failure kind at this position

    @property
    def title(self) -> str:
        parts = [f"position {self.position}", f"id {self.id}", self.kind, f"mask {self.mask}"]
        if self.turn >= 0:
            parts.append(f"turn {self.turn}")
        if self.logprob is not None:
            parts.append(f"logprob {self.logprob:.4f}")
        if self.finding is not None:
            parts.append(f"finding {self.finding}")
        if self.failure:
            parts.append(f"ENGINE VIEW FAILURE: {self.failure}")
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


@dataclass
class Fold:
    tokens: list[Token] = field(default_factory=list)  # empty when the run is left out of the page
    start: int = 0  # stream positions [start, end) of the folded run
    end: int = 0
    kinds: str = ""

    @property
    def count(self) -> int:
        return self.end - self.start

    @property
    def left_out(self) -> bool:
        return not self.tokens


Item = Token | Marker | Fold


def token_view(record: dict[str, Any], decode: Decode) -> list[Item]:
    ids: list[int] = [int(i) for i in record.get("input_ids") or []]
    n = len(ids)
    # The record's kinds come from the trajectory and may be longer than a truncated stream: align them.
    kinds = [str(k) for k in (record.get("kinds") or [])][:n]
    kinds += ["?"] * (n - len(kinds))
    mask = [int(m) for m in (record.get("loss_mask") or [])][:n]
    mask += [0] * (n - len(mask))
    calls = record.get("engine_calls") or []
    logprobs: dict[int, float] = {}
    starts = []
    for call in calls:
        start = int(call.get("prompt_length") or 0)
        starts.append(start)
        for i, lp in enumerate(call.get("logprobs") or []):
            logprobs[start + i] = float(lp)

    check = record.get("check") or {}
    findings = check.get("findings") or []
    owner: dict[int, tuple[int, bool]] = {}  # position -> (finding number, defect)
    markers: dict[int, list[Marker]] = {}
    for number, f in enumerate(findings, 1):
        start, end = (int(x) for x in f.get("stream") or (0, 0))
        defect = not f.get("allowed", False)
        for p in range(start, end):
            if p not in owner or (defect and not owner[p][1]):
                owner[p] = (number, defect)
        missing = tuple(pieces(str(f.get("rendered_text", "")))) if end == start else None
        title = f"finding {number}: {f.get('cause')} ({'defect' if defect else 'allowed'}) — {f.get('detail', '')}"
        markers.setdefault(min(start, n), []).append(Marker(str(number), str(f.get("cause")), defect, missing, title))
    failed: dict[int, str] = {}
    for k, f in enumerate(check.get("engine_failures") or [], 1):
        if f.get("position") is None:
            continue  # a failure of the whole record (e.g. lengths): shown above the tokens only
        p = int(f["position"])
        failed.setdefault(p, str(f.get("kind")))
        title = f"engine-view failure: {f.get('kind')} — {f.get('detail', '')}"
        marker = Marker(f"E{k}", f"engine: {f.get('kind')}", True, None, title, failure=True)
        markers.setdefault(min(p, n), []).append(marker)

    # Tokens near where a finding starts or ends, or where the engine view failed, are always shown; runs of
    # other tokens (inside a long finding too) are folded. Tokens are built only where shown.
    loud = set(markers) | set(failed)
    for f in findings:
        start, end = (int(x) for x in f.get("stream") or (0, 0))
        for edge in (start, end):
            loud.update(range(max(0, edge - FOLD_EDGE), min(n, edge + FOLD_EDGE)))

    def turn_at(p: int) -> int:
        return sum(1 for s in starts if s <= p) - 1

    def token(p: int) -> Token:
        return Token(
            position=p,
            id=ids[p],
            kind=kinds[p],
            mask=mask[p],
            turn=turn_at(p),
            logprob=logprobs.get(p) if kinds[p] == "sampled" else None,
            pieces=tuple(pieces(decode([ids[p]]))),
            finding=owner[p][0] if p in owner else None,
            defect=owner.get(p, (0, False))[1],
            failure=failed.get(p),
        )

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
