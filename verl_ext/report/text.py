"""Make whitespace visible: text becomes pieces that templates render, marking the whitespace ones."""

from __future__ import annotations

from typing import NamedTuple

# Shown instead of the character; the line break itself is kept after "↵" so lines still wrap as rendered.
_VISIBLE = {" ": "·", "\n": "↵\n", "\t": "⇥", "\r": "␍"}


class Piece(NamedTuple):
    """A run of decoded text, and whether it is whitespace (drawn visible in the page)."""

    text: str
    whitespace: bool


def pieces(text: str, breaks: bool = True) -> list[Piece]:
    """``"a b\\n"`` -> [("a", False), ("·", True), ("b", False), ("↵\\n", True)]; without ``breaks`` a newline
    is only "↵", for one-line displays."""
    out: list[Piece] = []
    run = ""
    for ch in text:
        if ch in _VISIBLE:
            if run:
                out.append(Piece(run, False))
                run = ""
            out.append(Piece(_VISIBLE[ch] if breaks else _VISIBLE[ch].rstrip("\n"), True))
        else:
            run += ch
    if run:
        out.append(Piece(run, False))
    return out


def shorten(text: str, limit: int = 160) -> str:
    """Keep both ends of long texts (the ends are where boundaries are)."""
    if len(text) <= limit:
        return text
    keep = (limit - 5) // 2
    return f"{text[:keep]} … {text[-keep:]}"
