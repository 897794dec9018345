"""Cutting one long plain text where the tokenizer provably cuts it too, so its pieces can be encoded in parallel.

``ChatRenderer.encode`` cuts a long text at points of the form ``[a-z]`` + ``" "`` + ``[a-z]`` (just before the
space) into one piece per tokenizers thread and encodes the pieces in one batch call. The pieces' ids, concatenated,
are the whole text's ids on every tokenizer ``text_cut_eligible`` accepts; the proof follows. Notation: the text is
``T = X + Y``, ``X`` ends with an ASCII lowercase letter, ``Y`` starts with a space and an ASCII lowercase letter,
``p = len(X)``.

1. Added tokens. The tokenizers library first finds added-token strings in the raw text (leftmost, then longest).
   With no lstrip/rstrip/single_word/normalized flag, whether a token matches at a position depends on nothing but
   the characters it spans; with no added token containing a space, no occurrence spans position ``p`` (a space).
   So the occurrences in ``T`` are those in ``X`` and those in ``Y`` (moved by ``p``), the scan of ``T`` is the scan
   of ``X`` then that of ``Y``, and ``T``'s text segments between added tokens are ``X``'s then ``Y``'s, except that
   the segment holding position ``p`` is cut in two there: ``s = s1 + s2``, ``s1`` ending with the letter (or empty,
   when an added token ends at ``p``) and ``s2`` starting with the space. Each segment is normalized, pre-tokenized
   and encoded on its own, so it remains to show that ``s`` gives the words of ``s1`` then those of ``s2``.
2. Normalizer: none, or NFC, NFD, NFKC, NFKD (alone or in a Sequence). The space and a-z are starters (canonical
   combining class 0), are their own (compatibility) decomposition and are never the second character of a
   composition: a normalization boundary lies before each (UAX #15), so ``NF(s) = NF(s1) + NF(s2)``, ``NF(s1)``
   still ends with its last letter and ``NF(s2)`` still starts with the space. (Tested over every code point in
   tests/core/test_rendering_text_cut.py.)
3. Pre-tokenizer regex (a Split by one of ``KNOWN_PATTERNS``, Isolated, not inverted, then ByteLevel without its
   regex; or ByteLevel with its GPT-2 regex). Each of these patterns (a) matches at every position and never matches
   empty, so its matches tile the text, each starting where the last ended (Isolated: the words are the matches);
   (b) has no lookbehind and no anchor, so the match at a position depends only on the text from there on; and (c)
   in every alternative, whatever may be tried right after an atom consumed a letter (another round of the same
   letter class, the next class, an optional contraction that starts with "'", or the end) cannot consume a space;
   the atoms that can (``\\s``, the optional leading `` ?`` or ``[^\\r\\n\\p{L}\\p{N}]?``) occur only first in an
   alternative or in runs that cannot hold a letter (``\\s+``, ``\\s*[\\r\\n]+``), and the one lookahead,
   ``(?!\\S)``, follows only ``\\s+``. So an attempt from a position before ``p`` can only test position ``p`` right
   after consuming the letter before it, and then fails there as the same attempt on ``X`` fails at ``X``'s end:
   every attempt before ``p`` goes the same way on ``T`` as on ``X``, ``T``'s words before ``p`` are ``X``'s, the
   last one ends at ``p``, and by (b) the words from ``p`` on are ``Y``'s. Per pattern, (c): Qwen2's and cl100k's
   consume letters in ``\\p{L}+`` (then more letters or the end) and in the contractions (fixed letters, then the
   end); o200k's in its upper/lower-case classes (then those classes, the optional contraction or the end); GPT-2's
   in `` ?\\p{L}+`` and its contractions. (a): letters, digits, whitespace and everything else each have an
   alternative that starts with them.
4. ByteLevel maps each word's bytes to characters and, with add_prefix_space, puts a space before a word that does
   not start with one: a function of the word alone. With its own regex it does so to a segment, before the regex
   runs: ``s1`` gets what ``s`` gets (it starts ``s``), ``s2`` nothing (it starts with a space), and step 3 applies
   to the prefixed text. The BPE model (no dropout) encodes each word on its own, and a post-processor
   of the kinds accepted adds nothing without special tokens. So the ids of ``T`` are those of ``X`` then ``Y``.

Anything else (Metaspace/SentencePiece-style tokenizers, other patterns, other models or normalizers, a flag or an
added token this proof does not cover) is encoded whole. A cut is only worth its cost when the tokenizers library
runs a batch on more than one thread (``parallel_threads``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

# Text shorter than this is encoded whole; no piece is shorter than TEXT_CUT_MIN_PIECE. Measured on Qwen3 and Qwen2.5
# (JSON lines, 2 threads, a contended 2-core machine): two pieces took 0.82x the whole text's wall time at 400
# characters, 0.7x at 1,000, 0.5x at 8,000; the threshold stays where the gain is clear of the cost of finding cuts.
TEXT_CUT_MIN_CHARS = 1024
TEXT_CUT_MIN_PIECE = 256

# Split patterns, exactly as tokenizer.json holds them, for which the proof above holds.
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CL100K_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)"
    r"|\s+"
)
O200K_PATTERN = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
KNOWN_PATTERNS = frozenset({QWEN2_PATTERN, CL100K_PATTERN, O200K_PATTERN})
_NORMALIZERS = frozenset({"NFC", "NFD", "NFKC", "NFKD"})
# Post-processors that, called without special tokens (encode's add_special_tokens=False), change no id.
_POST_PROCESSORS = frozenset({"ByteLevel", "TemplateProcessing", "RobertaProcessing", "BertProcessing"})
_ADDED_TOKEN_FLAGS = ("normalized", "lstrip", "rstrip", "single_word")

# The cut lies between the letter and the space (the match's end).
_CUT_POINT = re.compile(r"[a-z](?= [a-z])")


def text_cut_eligible(spec: Mapping[str, Any]) -> bool:
    """Whether cutting text before the space of each ``[a-z] [a-z]`` gives the whole text's ids with the tokenizer
    ``spec`` (tokenizer.json's shape: normalizer, pre_tokenizer, post_processor, model type and dropout, added tokens
    with their flags); see the module's proof. False for anything it does not cover."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE" or model.get("dropout") not in (None, 0, 0.0):
        return False
    if not only_types(spec.get("normalizer"), "normalizers", _NORMALIZERS):
        return False
    if not only_types(spec.get("post_processor"), "processors", _POST_PROCESSORS):
        return False
    for token in spec.get("added_tokens") or []:
        if not isinstance(token, Mapping) or " " in str(token.get("content")):
            return False
        if any(token.get(flag) for flag in _ADDED_TOKEN_FLAGS):
            return False
    return _known_pre_tokenizer(spec.get("pre_tokenizer"))


def _known_pre_tokenizer(pre: Any) -> bool:
    """A Split by a known pattern then ByteLevel without its regex, or ByteLevel with its own (GPT-2) regex."""
    if not isinstance(pre, Mapping):
        return False
    parts = pre.get("pretokenizers") if pre.get("type") == "Sequence" else [pre]
    if not isinstance(parts, list) or not all(isinstance(p, Mapping) for p in parts):
        return False
    if len(parts) == 1:
        return parts[0].get("type") == "ByteLevel" and parts[0].get("use_regex") is True
    if len(parts) != 2:
        return False
    split, byte_level = parts
    pattern = split.get("pattern")
    return (
        split.get("type") == "Split"
        and isinstance(pattern, Mapping)
        and list(pattern) == ["Regex"]
        and pattern["Regex"] in KNOWN_PATTERNS
        and split.get("behavior") == "Isolated"
        and split.get("invert") is False
        and byte_level.get("type") == "ByteLevel"
        and byte_level.get("use_regex") is False
    )


def spec_components(part: Any, key: str) -> list[Mapping[str, Any]]:
    """``part`` (a normalizer, pre-tokenizer or post-processor spec) and, for a Sequence, its members, flattened;
    anything that is not a spec comes back as an empty one (of no type)."""
    if not isinstance(part, Mapping):
        return [{}]
    if part.get("type") == "Sequence":
        members = part.get(key)
        return [c for m in members for c in spec_components(m, key)] if isinstance(members, list) else [{}]
    return [part]


def only_types(part: Any, key: str, known: frozenset[str]) -> bool:
    """``part`` is absent, or every component of it is of a ``known`` type."""
    return part is None or all(c.get("type") in known for c in spec_components(part, key))


def text_cuts(text: str, pieces: int) -> list[int]:
    """Up to ``pieces - 1`` cut positions in ``text`` (each just before the space of a ``[a-z] [a-z]``), near the
    points that divide it evenly, no piece shorter than ``TEXT_CUT_MIN_PIECE``. Each is searched for in a window after
    its even point, so a text with few such points (digits, CJK) costs one scan of it at most."""
    n = len(text)
    window = max(n // (2 * pieces), 1)
    cuts: list[int] = []
    last = 0
    for k in range(1, pieces):
        start = max(n * k // pieces, last + TEXT_CUT_MIN_PIECE)
        match = _CUT_POINT.search(text, start, min(n, start + window))
        if match is None:
            continue
        cut = match.end()
        if n - cut < TEXT_CUT_MIN_PIECE:
            break
        cuts.append(cut)
        last = cut
    return cuts


# -- how many threads the tokenizers library gives a batch ----------------------------------------------------------
_FORKED = False


def _mark_forked() -> None:
    global _FORKED
    _FORKED = True


# The tokenizers library turns its parallelism off in a child forked after the parent used it (unless
# TOKENIZERS_PARALLELISM is set), and sets that variable where Python's os.environ does not see it. Whether the
# parent used it is not exposed: any forked child counts as one thread (conservative: cutting then costs CPU for
# nothing).
os.register_at_fork(after_in_child=_mark_forked)

_OFF = frozenset({"", "off", "false", "f", "no", "n", "0"})  # what the tokenizers library reads as "no"


def parallel_threads() -> int:
    """The threads the tokenizers library spreads a batch over: 1 when TOKENIZERS_PARALLELISM says no (or, unset, in a
    forked child); else rayon's pool size, RAYON_NUM_THREADS or the CPUs this process may run on."""
    setting = os.environ.get("TOKENIZERS_PARALLELISM")
    if setting is not None and setting.lower() in _OFF:
        return 1
    if setting is None and _FORKED:
        return 1
    try:
        count = int(os.environ.get("RAYON_NUM_THREADS", "0"))
    except ValueError:
        count = 0
    if count > 0:
        return count
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
