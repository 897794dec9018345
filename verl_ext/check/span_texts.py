"""Span texts: the decoded text of the stream's and the render's spans, memoized per check
(every span decoded once, a span holding one already decoded decoding only the rest)."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence

from verl_ext.core.rendering import ChatRenderer


class SpanTexts:
    """The text of spans of the stream and of the render, each decoded once per check: what the rules and the
    verdicts read, and the prefixes of a turn's text up to each of its findings."""

    def __init__(self, r: ChatRenderer, stream: Sequence[int], rendered: Sequence[int]) -> None:
        self.r = r
        self.stream = stream
        self.rendered = rendered
        self._texts: dict[tuple[bool, int, int], str] = {}
        # per side, the decoded spans as (start, end, order decoded), by start: ``_known_inside`` looks in its range
        self._decoded: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
        # ``prefix``: per side and start, the prefixes read so far as (end, characters, brace depth, ends cut), by end
        self._prefixes: dict[tuple[bool, int], list[tuple[int, int, int, bool]]] = {}

    def texts(self, spans: Sequence[tuple[bool, int, int]]) -> list[str]:
        """The text of each ``(in_stream, start, end)`` span (of the stream, else of the render), every span decoded
        once per check and the new ones in one batch. Where the tokenizer's decode joins (``decode_joins``), a span
        holding one already decoded (a turn holding the thinking block its divergence read) decodes only the rest."""
        known = self._texts
        if all(span in known for span in spans):
            return [known[span] for span in spans]  # a turn's texts, asked again by each of its findings
        new = [span for span in dict.fromkeys(spans) if span not in self._texts]
        pieces = {span: self._known_inside(span) for span in new}
        wanted = list(dict.fromkeys(piece for span in new for piece in pieces[span] if piece not in self._texts))
        if wanted:
            for piece, text in zip(wanted, self.r.decode_many([self._ids(piece) for piece in wanted]), strict=True):
                self._remember(piece, text)
        for span in new:
            parts = [self._texts[piece] for piece in pieces[span]]
            cut = any(
                left.endswith("\ufffd") or right.startswith("\ufffd") for left, right in itertools.pairwise(parts)
            )
            self._remember(span, self.r.decode(self._ids(span)) if cut else "".join(parts))
        return [self._texts[span] for span in spans]

    def _remember(self, span: tuple[bool, int, int], text: str) -> None:
        """Keep ``span``'s text, and where a new span is, in decoding order (``_known_inside`` reads it)."""
        if span not in self._texts:
            in_stream, a, b = span
            bisect.insort(self._decoded[in_stream], (a, b, len(self._texts)))
        self._texts[span] = text

    def prefix(self, in_stream: bool, a: int, b: int) -> tuple[int, int]:
        """(the length in characters, the count of ``{`` less the count of ``}``) of the text of ``[a, b)`` of the
        stream (else of the render): what the rules explaining a turn's findings ask of the text from the turn's start
        to each finding, read once per span. Where decode joins (``decode_joins``), a span extends the longest one
        read from ``a`` before ``b`` by the text of the rest only (each finding of a turn decodes the few tokens
        since the one before, not the turn's text up to it); else decoded whole."""
        if b <= a:
            return 0, 0
        known = self._prefixes.setdefault((in_stream, a), [])
        k = bisect.bisect_right(known, (b, float("inf")))
        if k and known[k - 1][0] == b:
            return known[k - 1][1], known[k - 1][2]
        ids = self.stream if in_stream else self.rendered
        if k and self.r.decode_joins and not known[k - 1][3]:
            c, chars, depth, _ = known[k - 1]
            rest = self.r.decode(ids[c:b])
            if not rest.startswith("\ufffd"):
                entry = (b, chars + len(rest), depth + rest.count("{") - rest.count("}"), rest.endswith("\ufffd"))
                known.insert(k, entry)
                return entry[1], entry[2]
        text = self.r.decode(ids[a:b])
        entry = (b, len(text), text.count("{") - text.count("}"), text.endswith("\ufffd"))
        known.insert(k, entry)
        return entry[1], entry[2]

    def _ids(self, span: tuple[bool, int, int]) -> Sequence[int]:
        in_stream, a, b = span
        return (self.stream if in_stream else self.rendered)[a:b]

    def _known_inside(self, span: tuple[bool, int, int]) -> list[tuple[bool, int, int]]:
        """``span`` as pieces: the longest span already decoded inside it with what lies before and after it, where
        decode joins; else ``span`` itself."""
        in_stream, a, b = span
        if not self.r.decode_joins:
            return [span]
        # the spans decoded so far that start in [a, b): bisected, not every span of the check
        known = self._decoded[in_stream]
        lo, hi = bisect.bisect_left(known, (a,)), bisect.bisect_left(known, (b,))
        inside = [(x, y, n) for x, y, n in known[lo:hi] if x < y <= b and (x, y) != (a, b)]
        if not inside:
            return [span]
        # the longest, the first decoded of equal ones (as a scan of the spans in decoding order finds it)
        x, y, _ = min(inside, key=lambda k: (k[0] - k[1], k[2]))
        return [piece for piece in ((in_stream, a, x), (in_stream, x, y), (in_stream, y, b)) if piece[1] < piece[2]]
