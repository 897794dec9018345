"""``ChatRenderer.decode_joins``: where it holds, a text is its pieces' texts joined unless a cut shows a cut
character; the check builds a turn's text from the thinking block it already decoded on that claim."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SHIPPED = {"qwen3": True, "qwen2.5": True, "gpt-oss": True, "mistral-7b-v0.3": False}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_which_tokenizers_join(renderer_for: Any, name: str) -> None:
    assert renderer_for(name).decode_joins is SHIPPED[name]


@pytest.mark.parametrize("name", [n for n, joins in SHIPPED.items() if joins])
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_pieces_join_to_the_whole_unless_a_cut_shows(renderer_for: Any, name: str, data: st.DataObject) -> None:
    r = renderer_for(name)
    text = data.draw(st.text(max_size=40)) + "é 你好 \U0001f600 <|im_end|>\n  x"
    ids = r.tokenizer.encode(text, add_special_tokens=False)
    ids = ids + data.draw(st.lists(st.integers(0, len(r.tokenizer) - 1), max_size=8))  # any id, partial bytes too
    a = data.draw(st.integers(0, len(ids)))
    b = data.draw(st.integers(a, len(ids)))
    parts = [r.decode(ids[:a]), r.decode(ids[a:b]), r.decode(ids[b:])]
    cut = any(left.endswith("\ufffd") or right.startswith("\ufffd") for left, right in itertools.pairwise(parts))
    if not cut:
        assert "".join(parts) == r.decode(ids)


def test_a_sentencepiece_piece_loses_its_leading_space(renderer_for: Any) -> None:
    """Why Mistral does not join: the space token that starts a piece decodes to nothing alone."""
    r = renderer_for("mistral-7b-v0.3")
    ids = r.tokenizer.encode("hello world", add_special_tokens=False)  # "▁hell", "o", "▁world"
    assert r.decode(ids[:2]) + r.decode(ids[2:]) == "helloworld" != r.decode(ids)
