"""Literal template text turned into patterns that accept the spacing a model varies.

A template renders ``<tool_call>\\n{...}\\n</tool_call>``; a model trained on it may write
``<tool_call>{...}</tool_call>`` or indent the object. The literal is cut into chunks (control markers and runs of
other non-space text) and the pattern lets any whitespace, or none, sit between and around them. A number inside a
literal that changes with the call's position (Kimi's ``functions.NAME:0``, ``:1``) is learned as a counter and
matches any number.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

# Control markers as chat templates write them: <|x|>, <｜x｜>, [X], <x:y>, <x_of_y>, and tags <x>, </x>, <x=.
MARKER = re.compile(
    r"<\|[^<>|\s]+\|>|<｜[^｜<>]+｜>|\[/?[A-Z][A-Z_]*\]|</?[a-z_]+:[a-z_]+>|<[a-z]+_of_[a-z]+>|</?[A-Za-z_][\w\-]*>?"
)
COUNTER = "\x00"  # stands for a number that counts the calls in a learned literal


def chunks(literal: str) -> list[str]:
    """``literal`` cut into markers and runs of other non-space text, in order (whitespace dropped)."""
    out: list[str] = []
    for word in literal.split():
        at = 0
        for m in MARKER.finditer(word):
            if m.start() > at:
                out.append(word[at : m.start()])
            out.append(m.group())
            at = m.end()
        if at < len(word):
            out.append(word[at:])
    return out


def chunk_pattern(chunk: str) -> str:
    """One chunk as a regex: escaped, with a learned counter matching any number."""
    return r"\d+".join(re.escape(p) for p in chunk.split(COUNTER))


def spaced(literal: str) -> str:
    """A regex for ``literal`` with any whitespace around and between its chunks (empty literal: any whitespace)."""
    parts = chunks(literal)
    if not parts:
        return r"\s*"
    return r"\s*" + r"\s*".join(chunk_pattern(c) for c in parts) + r"\s*"


def common_suffix(texts: Sequence[str]) -> str:
    """The longest text every one of ``texts`` ends with."""
    reversed_prefix = os.path.commonprefix([t[::-1] for t in texts])
    return reversed_prefix[::-1]


def common_prefix(texts: Sequence[str]) -> str:
    """The longest text every one of ``texts`` starts with."""
    return os.path.commonprefix(list(texts))


def counted(literals: Sequence[str]) -> str | None:
    """One literal for texts that differ only in their numbers (a call counter): the numbers that differ become
    ``COUNTER``; None where they differ in anything else."""
    split = [re.split(r"(\d+)", t) for t in literals]
    if len({len(s) for s in split}) != 1:
        return None
    out = []
    for i, parts in enumerate(zip(*split, strict=True)):
        if len(set(parts)) == 1:
            out.append(parts[0])
        elif i % 2 == 1:  # a number that differs between the calls
            out.append(COUNTER)
        else:
            return None
    return "".join(out)
