"""literal_alternation finds exactly what longest-first alternation finds, on the shipped tokenizers' special-token
strings and on hand-made overlapping sets (its speed is measured in the module's docstring, not asserted here)."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest
from template_fixtures import SHIPPED

from verl_ext.core.literal_regex import _MAX_TRIE_DEPTH, literal_alternation


def longest_first(strings: set[str]) -> re.Pattern[str]:
    return re.compile("|".join(re.escape(s) for s in sorted(strings, key=len, reverse=True)))


def spans(pattern: re.Pattern[str], text: str) -> list[tuple[int, int]]:
    return [m.span() for m in pattern.finditer(text)]


def text_from(strings: list[str], rng: random.Random, pieces: int) -> str:
    """Text made of whole strings, their prefixes, suffixes and middles, and noise, so that matches overlap, run
    into each other and stop one character short."""
    out = []
    for _ in range(pieces):
        s = rng.choice(strings)
        a, b = sorted(rng.sample(range(len(s) + 1), 2)) if len(s) > 1 else (0, len(s))
        out.append(rng.choice([s, s, s[:b], s[a:], s[a:b], rng.choice("x[<|/ \n_")]))
    return "".join(out)


OVERLAPPING = [
    {"ab", "abc", "b", "bc", "c"},
    {"<|im_end|>", "<|im_end|>x", "<|im", "|>", "im_end"},
    {"a", "aa", "aaa", "aaaa"},
    {"[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[control_1]", "[control_10]", "[control_100]", "]", "[", "/"},
    {"x" * (_MAX_TRIE_DEPTH + 5), "x" * (_MAX_TRIE_DEPTH + 1), "x" * 3, "xy"},  # longer than the trie holds
    {"a.b", "a*b", "(", ")", "\\", "a|b"},  # regex metacharacters stay literal
    # Every level both ends a string and branches: deep nesting for the regex parser (this raised RecursionError
    # when paths of up to 256 characters went into the trie).
    {"a" * k for k in range(1, 257)} | {"a" * k + "b" for k in range(256)},
]


@pytest.mark.parametrize("strings", OVERLAPPING, ids=range(len(OVERLAPPING)))
def test_the_same_matches_as_longest_first_alternation(strings: set[str]) -> None:
    trie, plain = re.compile(literal_alternation(strings)), longest_first(strings)
    rng = random.Random(0)
    for _ in range(300):
        text = text_from(sorted(strings), rng, rng.randint(1, 30))
        assert spans(trie, text) == spans(plain, text), text


@pytest.mark.parametrize("family", SHIPPED)
def test_the_same_matches_on_a_shipped_tokenizer(renderer_for: Any, family: str) -> None:
    r = renderer_for(family)
    strings = {t.content for t in r.tokenizer.added_tokens_decoder.values() if t.content}
    trie, plain = re.compile(literal_alternation(strings)), longest_first(strings)
    rng = random.Random(1)
    for _ in range(100):
        text = text_from(sorted(strings), rng, rng.randint(1, 60))
        assert spans(trie, text) == spans(plain, text)


def test_nothing_to_find_gives_an_empty_pattern() -> None:
    assert literal_alternation([]) == literal_alternation([""]) == ""
