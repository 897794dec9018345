"""``ChatRenderer.encode`` on long text: cut at special-token strings and batch-encoded, it must give exactly
``tokenizer.encode(text, add_special_tokens=False)``'s ids, on every tokenizer the project ships or tests.

The texts put special-token strings where cutting could go wrong: mid-word, adjacent, at the start and the end, and
followed by leading spaces and newlines (a Metaspace tokenizer that marks only the input's start, Mistral's, encodes
"[INST]Hello" without the "▁" it puts before a text that starts the input). Each text is long enough to take the
chunked path, and each test asserts that it did, so none of them passes by encoding the text whole.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer

from verl_ext.core.rendering import (
    PARALLEL_MAX_PIECE_SHARE,
    PARALLEL_MIN_CHARS,
    ChatRenderer,
)
from verl_ext.core.special_token_cut import chunking_plan, light_spec

FAMILIES = ("qwen3", "qwen2.5", "gpt-oss", "mistral-7b-v0.3")
# Every fixture template over the tokenizer the tests give it, with its markers (tests/template_fixtures.py):
# SentencePiece-style Mistral, or the byte-level Qwen3 base for DeepSeek's full-width markers.
TEMPLATES_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "templates"
FIXTURE_TEMPLATES = tuple(p.stem for p in sorted(TEMPLATES_DIR.glob("*.jinja")))
WORDS = ("Hello", " world", "\n", "  two", "\n\nx", " ", "é", "naïve", '{"a": 1}', "1234", "▁x", "\t")


def tricky_text(specials: list[str], seed: int = 0) -> str:
    """Special-token strings mid-word, adjacent, at the start and end, before spaces and newlines; longer than
    ``PARALLEL_MIN_CHARS``."""
    parts: list[str] = [specials[0]]  # at the very start
    k = seed
    while sum(map(len, parts)) < 2 * PARALLEL_MIN_CHARS:
        s, t = specials[k % len(specials)], specials[(k * 7 + 3) % len(specials)]
        w = WORDS[k % len(WORDS)]
        parts += [
            f"mid{s}word",  # inside a word
            s + t,  # adjacent
            f"{s} {w}",  # a leading space after it
            f"{s}\n{w}",  # a leading newline after it
            f"{s}{w}",  # text right after it (no space)
            f"{w}{s}",
            "  " + s + "  ",
        ]
        k += 1
    parts.append(specials[-1])  # at the very end
    return "".join(parts)


def specials_of(r: ChatRenderer) -> list[str]:
    added = r.tokenizer.added_tokens_decoder
    strings = [added[i].content for i in sorted(r.control_ids)]
    return [s for s in strings if s][:40]


def assert_chunked_equal(r: ChatRenderer, text: str) -> None:
    assert len(text) >= PARALLEL_MIN_CHARS
    plan = r._chunking
    assert plan is not None, f"{r.name}: chunking refused; this test would not exercise it"
    assert max(map(len, plan[0].split(text))) * PARALLEL_MAX_PIECE_SHARE <= len(text), "a piece too long to cut"
    expected = list(r.tokenizer.encode(text, add_special_tokens=False))
    got = r.encode(text)
    if got != expected:
        k = next(i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b)
        raise AssertionError(f"{r.name}: ids differ at {k}: {got[k - 3 : k + 3]} vs {expected[k - 3 : k + 3]}")
    assert got == expected


@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_encode_equals_encode_on_shipped_tokenizers(renderer_for: Any, family: str) -> None:
    r = renderer_for(family)
    for seed in range(3):
        assert_chunked_equal(r, tricky_text(specials_of(r), seed))
    # A real long render: many turns of a tool loop.
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for k in range(400):
        messages += [
            {"role": "user", "content": f"Question {k}: what is {k} + 1?\n  (answer briefly)"},
            {"role": "assistant", "content": f" It is {k + 1}.\n"},
        ]
    text = r.render_text(messages)
    assert_chunked_equal(r, text)


@pytest.mark.parametrize("name", FIXTURE_TEMPLATES)
def test_chunked_encode_equals_encode_on_fixture_tokenizers(name: str) -> None:
    from template_fixtures import template_renderer

    r = template_renderer(name)
    assert_chunked_equal(r, tricky_text(specials_of(r)))


def test_chunked_encode_with_plain_added_whitespace_tokens(gemma_like_renderer: Any) -> None:
    """Gemma's vocabulary holds "\\n" and whitespace runs as plain added tokens: the tokenizer cuts at those too."""
    r = gemma_like_renderer
    assert_chunked_equal(r, tricky_text(specials_of(r)))


def test_metaspace_first_pieces_are_continuations(renderer_for: Any) -> None:
    """Mistral's pre-tokenizer marks only the input's start with "▁": a piece after a special token encoded on its
    own would get one. Chunking must use the continuation tokenizer for it; shown by a naive cut that differs."""
    r = renderer_for("mistral-7b-v0.3")
    plan = r._chunking
    assert plan is not None and plan[1] is not None  # the continuation tokenizer is in the plan
    text = ("[INST]Hello[/INST]world</s>[INST]\nx[/INST]  y" * 2000)[: 3 * PARALLEL_MIN_CHARS]
    expected = list(r.tokenizer.encode(text, add_special_tokens=False))
    pieces = [p for p in plan[0].split(text) if p]
    naive = [
        i for e in r.tokenizer.backend_tokenizer.encode_batch_fast(pieces, add_special_tokens=False) for i in e.ids
    ]
    assert naive != expected  # what the eligibility rule guards against
    assert r.encode(text) == expected
    assert r.encode("Hello" + text) == list(r.tokenizer.encode("Hello" + text, add_special_tokens=False))


def encode_apart(r: ChatRenderer, pieces: list[str]) -> list[int]:
    """``pieces`` encoded each on its own by the tokenizer's backend, concatenated (the naive cut)."""
    encoded = r.tokenizer.backend_tokenizer.encode_batch_fast(pieces, add_special_tokens=False)
    return [i for e in encoded for i in e.ids]


def qwen3_with(renderer_for: Any, *tokens: AddedToken) -> ChatRenderer:
    """A fresh copy of the Qwen3 tokenizer with ``tokens`` added, in a renderer."""
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(renderer_for("qwen3").tokenizer.backend_tokenizer.to_str())
    backend.add_special_tokens(list(tokens))
    tok = PreTrainedTokenizerFast(tokenizer_object=backend)
    return ChatRenderer(tok, chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")


def test_a_special_token_another_runs_into_is_not_a_cut(renderer_for: Any) -> None:
    """ "y<|x" ends with the start of "<|x|>": in "ay<|x|>b" the tokenizer matches "y<|x" and "<|x|>" is not a token.
    Cutting at "<|x|>" would split the text elsewhere than the tokenizer; the plan must not cut there."""
    r = qwen3_with(
        renderer_for,
        AddedToken("<|x|>", special=True, normalized=False),
        AddedToken("y<|x", special=True, normalized=False),
        AddedToken("<|in<|z|>|>", special=True, normalized=False),  # holds "<|z|>": a match over it
        AddedToken("<|z|>", special=True, normalized=False),
    )
    plan = r._chunking
    assert plan is not None
    assert plan[0].fullmatch("<|x|>") is None and plan[0].fullmatch("<|z|>") is None
    assert plan[0].fullmatch("<|im_end|>") is not None  # the others are still cuts
    text = ("ay<|x|>b<|im_end|>\n<|x|> c<|in<|z|>|>d<|z|><|im_start|>" * 2000)[: 3 * PARALLEL_MIN_CHARS]
    cut = [p for p in re.split(r"(<\|x\|>|<\|z\|>)", text) if p]
    expected = list(r.tokenizer.encode(text, add_special_tokens=False))
    assert encode_apart(r, cut) != expected  # cutting at those two would be wrong
    assert r.encode(text) == expected


METASPACE_FIRST = {"type": "Metaspace", "prepend_scheme": "first"}


def spec(**parts: Any) -> dict[str, Any]:
    """A tokenizer.json-shaped dict with one special token and the given parts."""
    base: dict[str, Any] = {
        "normalizer": None,
        "pre_tokenizer": None,
        "model": {"type": "BPE", "dropout": None},
        "added_tokens": [{"content": "<s>", "special": True, "normalized": False}],
    }
    return {**base, **parts}


@pytest.mark.parametrize(
    ("parts", "eligible", "continuation"),
    [
        ({}, True, False),
        ({"pre_tokenizer": {"type": "Metaspace", "prepend_scheme": "first"}}, True, True),
        ({"pre_tokenizer": {"type": "Metaspace", "prepend_scheme": "always"}}, True, False),
        (
            {
                "pre_tokenizer": {
                    "type": "Sequence",
                    "pretokenizers": [{"type": "Metaspace", "prepend_scheme": "first"}],
                }
            },
            True,
            True,
        ),
        ({"pre_tokenizer": {"type": "Metaspace", "add_prefix_space": True}}, False, False),  # an older file: unknown
        ({"pre_tokenizer": {"type": "SomethingNew"}}, False, False),
        ({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split"}, "junk"]}}, False, False),
        ({"normalizer": {"type": "NFC"}}, True, False),
        ({"normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend"}, {"type": "Replace"}]}}, True, False),
        ({"normalizer": {"type": "SomethingNew"}}, False, False),
        ({"model": {"type": "BPE", "dropout": 0.1}}, False, False),
        ({"added_tokens": [{"content": "<s>", "special": True, "normalized": True}]}, False, False),
        ({"added_tokens": [{"content": "<s>", "special": True, "lstrip": True}]}, False, False),
        ({"added_tokens": [{"content": "<s>", "special": True, "rstrip": True}]}, False, False),
        ({"added_tokens": [{"content": "<s>", "special": True, "single_word": True}]}, False, False),
        ({"added_tokens": [{"content": "<s>", "special": False}]}, False, False),  # no special token: no cut
        ({"added_tokens": [{"content": "aa", "special": True}]}, False, False),  # overlaps itself ("aaa")
    ],
)
def test_chunking_plan_eligibility(parts: dict[str, Any], eligible: bool, continuation: bool) -> None:
    plan = chunking_plan(spec(**parts))
    assert (plan is not None) == eligible
    if plan is not None:
        assert plan[1] == continuation


@pytest.mark.parametrize("family", FAMILIES)
def test_light_spec_reads_what_tokenizer_json_says(renderer_for: Any, family: str) -> None:
    """The plan from the backend's parts is the plan from its whole tokenizer.json."""
    backend = renderer_for(family).tokenizer.backend_tokenizer
    full = chunking_plan(json.loads(backend.to_str()))
    light = chunking_plan(light_spec(backend))
    assert full is not None and light is not None
    assert (full[0].pattern, full[1]) == (light[0].pattern, light[1])


def test_tokens_added_after_the_first_long_encode_are_seen(renderer_for: Any) -> None:
    """A token added to the tokenizer after the plan was made (tests add markers to copies) changes the plan."""
    r = qwen3_with(renderer_for)
    text = "ab<|im_end|>cd<|new|>ef" * 2000
    assert r.encode(text) == list(r.tokenizer.encode(text, add_special_tokens=False))
    r.tokenizer.add_tokens([AddedToken("d<|new|>e<|im_end|>", special=True, normalized=False)], special_tokens=True)
    text = "ab<|im_end|>cd<|new|>e<|im_end|>f" * 2000
    assert r.encode(text) == list(r.tokenizer.encode(text, add_special_tokens=False))


def test_a_token_re_added_with_other_flags_changes_the_plan(renderer_for: Any) -> None:
    """Re-adding ``<|im_end|>`` with rstrip keeps the added-token count but makes it a bad cut (its match now
    swallows the newline after it): the plan made before must not be reused."""
    r = qwen3_with(renderer_for)
    text = "<|im_start|>user\nhello there friend<|im_end|>\n" * 600
    assert r._chunking is not None
    assert_chunked_equal(r, text)
    r.tokenizer.add_special_tokens({"eos_token": AddedToken("<|im_end|>", rstrip=True, special=True, normalized=False)})
    expected = list(r.tokenizer.encode(text, add_special_tokens=False))
    assert encode_apart(r, re.split(r"(<\|im_end\|>)", text)) != expected  # a cut there would now be wrong
    assert r.encode(text) == expected


def test_a_custom_pre_tokenizer_is_encoded_whole(renderer_for: Any) -> None:
    """A Python pre-tokenizer cannot be serialised, so the plan cannot be shown: the text is encoded whole, and
    encoding does not fail."""
    from tokenizers.pre_tokenizers import PreTokenizer

    class Words:
        def pre_tokenize(self, pretok: Any) -> None:
            pretok.split(lambda i, s: s.split(" ", "merged_with_next"))

    r = qwen3_with(renderer_for)
    r.tokenizer.backend_tokenizer.pre_tokenizer = PreTokenizer.custom(Words())
    text = "ab cd<|im_end|>ef gh" * 2000
    assert r._chunking is None
    assert r.encode(text) == list(r.tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize("family", FAMILIES)
def test_decode_equals_tokenizer_decode(renderer_for: Any, family: str) -> None:
    """``ChatRenderer.decode`` (the backend's decode, where that is what transformers does) is ``tokenizer.decode``,
    special tokens and byte pieces of split characters included."""
    r = renderer_for(family)
    assert r._decoder is not None  # the direct path is the one tested
    ids = r.tokenizer.encode(tricky_text(specials_of(r)), add_special_tokens=False)
    for part in (ids, ids[1:], ids[:-1], ids[3:77], [], ids[:1]):
        assert r.decode(part) == r.tokenizer.decode(part, skip_special_tokens=False)
    cut = r.tokenizer.encode("naïve é 日本語 🙂", add_special_tokens=False)
    for k in range(len(cut)):  # a character cut between tokens decodes as transformers decodes it
        assert r.decode(cut[:k]) == r.tokenizer.decode(cut[:k], skip_special_tokens=False)


@pytest.mark.parametrize("family", FAMILIES)
def test_decode_many_equals_decode_one_by_one(renderer_for: Any, family: str) -> None:
    """``ChatRenderer.decode_many`` (one batch call, what the check decodes its divergences with) is ``decode`` on
    each sequence, in order: empty sequences, special tokens and characters cut between tokens included."""
    r = renderer_for(family)
    ids = r.tokenizer.encode(tricky_text(specials_of(r)), add_special_tokens=False)
    cut = r.tokenizer.encode("naïve é 日本語 🙂", add_special_tokens=False)
    parts = [ids, [], ids[1:], ids[3:77], ids[:1], *(cut[:k] for k in range(len(cut))), tuple(ids[:-1])]
    assert r.decode_many(parts) == [r.decode(p) for p in parts]
    assert r.decode_many([]) == []
