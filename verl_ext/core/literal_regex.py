"""A regular expression that finds any of many literal strings, taking the longest one where several start.

``"|".join(re.escape(s) for s in longest_first)`` does the same, but Python's ``re`` tries every alternative at
every position where the first character fits: with Mistral's 771 ``[control_N]`` tokens, splitting a rendered
chat at its special tokens took 1.6 ms per 24k characters (65 ns a character). The same strings as a trie (common
prefixes written once) take one branch per character.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

_END = ""  # the trie key that marks "a string ends here" (no real edge is empty)
# Characters: deeper paths go to the plain list. Each trie level can nest groups that Python's regex parser
# recurses through (about 4 frames a level), so this keeps compiling far from the recursion limit wherever it is
# called from; special-token strings are rarely longer (Gemma's longest whitespace run is 31).
_MAX_TRIE_DEPTH = 48


def literal_alternation(strings: Iterable[str]) -> str:
    """Regex source matching exactly what ``"|".join(map(re.escape, sorted(strings, key=len, reverse=True)))``
    matches: at each position, the longest of ``strings`` that starts there. Empty strings are ignored; with none
    left, the result is ``""`` (the caller decides what no strings means)."""
    unique = {s for s in strings if s}
    # Strings longer than any trie path this module recurses through are tried first, longest first, as plain
    # alternatives: each is longer than every string in the trie, so the order stays longest first.
    long = sorted((s for s in unique if len(s) > _MAX_TRIE_DEPTH), key=len, reverse=True)
    trie: dict[str, dict] = {}
    for s in unique - set(long):
        node = trie
        for ch in s:
            node = node.setdefault(ch, {})
        node[_END] = {}
    return "|".join([*(re.escape(s) for s in long), *filter(None, [_pattern(trie)])])


def _pattern(node: dict[str, dict]) -> str:
    branches = [re.escape(ch) + _pattern(child) for ch, child in sorted(node.items()) if ch != _END]
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
    if _END in node:
        # A string ends here and longer ones go on: the greedy ``?`` tries the longer first and backtracks to the
        # end here only when none of them matches, which is what longest-first alternation gives.
        body = "(?:" + body + ")?"
    return body
