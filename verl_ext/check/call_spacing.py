"""Where whitespace lies in a tool-call turn: before the first call, between two, after the last, before the close.

A model spaces its calls its own way and the template re-writes them its own way: a newline or none before the
first call, between calls, after the last and before the turn's close. Where the call markers are plain text to
the tokenizer, that whitespace merges with the markers' last characters into other tokens (``>`` against ``>\\n``),
so it is found on the two texts, never on the ids: the texts are equal once whitespace is set aside, and the first
place they differ lies outside every call, at one of those places. The place is read from the turn's call blocks
(``tool_call_compare``: cut by the markers the template writes once per call), so it is the template's own, on any
template.

The same holds for the template's other tags (a reasoning block's ``<think>`` and ``</think>``): where the tokenizer
holds them as plain text, the text verdict reads them as structure too (``with_plain_tags``), as it reads them where
they are control tokens, so the template's newline next to one is not read as a space inside the words around it.
And a turn's text holds its markers whole: where the alignment starts the turn inside a plain-text marker (QwQ's
generation prompt ends in ``<think>\n``, the history writes ``<tool_call>`` there, and the two share the token
``<``), the turn's text starts before the marker (``cuts_a_marker``), or its first call would not be read.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from typing import Any, Protocol

from verl_ext.core.call_reader import learn_call_reader
from verl_ext.core.call_reader.leftover import call_markers
from verl_ext.core.call_reader.literals import MARKER

_MARKER_REACH = 64  # characters after a cut a marker may end within


class _Block(Protocol):
    start: int
    end: int


def whitespace_only(a: str, b: str) -> bool:
    """The two texts differ, and only in whitespace."""
    return a != b and "".join(a.split()) == "".join(b.split())


def differing_whitespace(a: str, b: str) -> tuple[str, str]:
    """What two texts that differ only in whitespace hold where they differ: each text without the longest prefix and
    suffix the two share (``'>\\n'`` against ``'>'``: ``'\\n'`` and ``''``)."""
    head = len(os.path.commonprefix([a, b]))
    tail = len(os.path.commonprefix([a[head:][::-1], b[head:][::-1]]))
    return a[head : len(a) - tail], b[head : len(b) - tail]


def spacing_place(blocks: Sequence[_Block], at: int, closing: bool) -> str | None:
    """The place of character offset ``at`` of a turn's sampled text, where it lies outside every call block in
    ``blocks`` (in order): "before the first call", "between calls K and K+1", "after the last call" (with "before
    the close" where only the turn's close follows: ``closing``); None where it lies inside a call or the turn holds
    no call."""
    if not blocks or any(b.start < at < b.end for b in blocks):
        return None
    before = sum(1 for b in blocks if b.end <= at)
    if before == 0:
        return "before the first call"
    if before < len(blocks):
        return f"between calls {before} and {before + 1}"
    return "after the last call, before the close" if closing else "after the last call"


@functools.lru_cache(maxsize=64)
def with_plain_tags(structure: re.Pattern[str] | None, tags: tuple[str, ...]) -> re.Pattern[str] | None:
    """``structure`` (the tokenizer's control-token text) matching also those of the template's own ``tags``
    (tag-shaped texts it writes as structure: reasoning tags, call markers) that it does not match, which the
    tokenizer holds as plain text; ``structure`` itself where there are none."""
    plain = [t for t in dict.fromkeys(tags) if MARKER.fullmatch(t) and not (structure and structure.fullmatch(t))]
    if not plain:
        return structure
    alternatives = "|".join(re.escape(t) for t in sorted(plain, key=len, reverse=True))
    return re.compile(f"(?:{structure.pattern})|{alternatives}" if structure is not None else alternatives)


def form_markers(renderer: Any, profile: Any) -> tuple[str, ...]:
    """Every control marker the reader derived from the template writes around its calls (a section's opener and
    close too: DeepSeek's ``<｜tool▁calls▁begin｜>`` and ``<｜tool▁calls▁end｜>``, which the per-call markers leave
    out); none where no reader is derived. Where the tokenizer holds them as plain text they are structure to the
    text verdict, so whitespace next to one is spacing (``'<｜tool▁calls▁begin｜>\\n<｜tool▁calls▁end｜>'`` against
    the two written together), not a space inside sampled words."""
    reader = learn_call_reader(renderer, profile).reader
    return call_markers(reader.form) if reader is not None else ()


def cuts_a_marker(head: str, texts: Sequence[str]) -> bool:
    """A tag-shaped marker starts in ``head`` (text both sides share right before a cut) and ends after it in one of
    ``texts`` (each side's text from the cut on)."""
    # An angle marker holds no '<' but its first character and no '>' but its last, a bracket one ('[TOOL_CALLS]')
    # only capitals inside: one that ends past the cut starts at the last '<' (or '[') of ``head`` and has no end
    # after it there. Most cuts follow a whole marker: nothing to search then.
    lt, lb = head.rfind("<"), head.rfind("[")
    if (lt == -1 or ">" in head[lt:]) and (lb == -1 or "]" in head[lb:]):
        return False
    for text in texts:
        joined = head + text[:_MARKER_REACH]
        if any(m.start() < len(head) < m.end() for m in MARKER.finditer(joined)):
            return True
    return False
