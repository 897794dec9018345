"""``ChatRenderer.encode`` on one long plain text: cut before the space of ``[a-z] [a-z]`` into one piece per
tokenizers thread and batch-encoded, it must give exactly ``tokenizer.encode(text, add_special_tokens=False)``'s ids.

The texts are fuzzed (words of every case, digits, newlines and space runs, contractions, accents and combining
marks, CJK, emoji, compatibility characters, the tokenizer's special-token strings). Each test records the batches
the renderer hands the tokenizers library, so it asserts that the text was cut (or, where the proof does not hold
or only one thread encodes, that it was not); and a naive cut elsewhere gives other ids, so equality is no accident.
"""

from __future__ import annotations

import copy
import json
import os
import random
import re
import unicodedata
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer

from verl_ext.core import text_cut
from verl_ext.core.rendering import PARALLEL_MIN_CHARS, ChatRenderer
from verl_ext.core.special_token_cut import light_spec
from verl_ext.core.text_cut import (
    CL100K_PATTERN,
    O200K_PATTERN,
    QWEN2_PATTERN,
    TEXT_CUT_MIN_CHARS,
    TEXT_CUT_MIN_PIECE,
    parallel_threads,
    text_cut_eligible,
    text_cuts,
)

BYTE_LEVEL = ("qwen3", "qwen2.5", "gpt-oss")
FRAGMENTS = (
    "alpha", "Beta", "GAMMA", "it's", "we'll", "I'M", "they'RE", "don't", "x'd", "naïve", "cafe\u0301", "a\u0308",
    "Å", "ﬁne", "ｆｕｌｌ", "日本語", "中文字", "🙂", "1234567", "3.14", "\n", "\r\n", "\n\n", "  ", "   ", "\t",
    " \n ",
    "\u00a0", "\u3000", '{"id": 12, "name": "bolt crate"}', "<tag>", "--", "/path/to", "ǅungla", "Ωmega", "ß",
)  # fmt: skip


def fuzzed_text(rng: random.Random, specials: list[str], n_chars: int) -> str:
    """Random words and fragments, mostly separated by single spaces (so there are cut points), of ``n_chars``."""
    parts: list[str] = []
    size = 0
    while size < n_chars:
        roll = rng.random()
        if roll < 0.45:
            part = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 9)))
        elif roll < 0.9:
            part = rng.choice(FRAGMENTS)
        else:
            part = rng.choice(specials)
        sep = rng.choice([" ", " ", " ", "", "\n", "  ", ", "])
        parts.append(part + sep)
        size += len(part) + len(sep)
    return "".join(parts)


class Recording:
    """The renderer's backend, unchanged, noting how many inputs each ``encode_batch_fast`` call got and how often its
    added tokens were read."""

    def __init__(self, backend: Tokenizer) -> None:
        self._backend = backend
        self.batches: list[int] = []
        self.added_token_reads = 0

    def get_added_tokens_decoder(self) -> Any:
        self.added_token_reads += 1
        return self._backend.get_added_tokens_decoder()

    def encode_batch_fast(self, inputs: list[str], **kwargs: Any) -> Any:
        self.batches.append(len(inputs))
        return self._backend.encode_batch_fast(inputs, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)


def recorded(r: ChatRenderer) -> Recording:
    """Put a recording wrapper around ``r``'s backend (the renderer encodes through it from now on)."""
    recording = Recording(r._backend)  # type: ignore[arg-type]
    r.__dict__["_backend"] = recording
    r.__dict__.pop("_plans_cache", None)
    r.__dict__.pop("_components_cut_cache", None)
    return recording


def fresh(r: ChatRenderer) -> ChatRenderer:
    """A renderer of its own over the same tokenizer (the recording wrapper must not leak into shared fixtures)."""
    return ChatRenderer(r.tokenizer, chat_template=r.chat_template)


def specials_of(r: ChatRenderer) -> list[str]:
    return [t.content for t in r.tokenizer.added_tokens_decoder.values()][:30]


def expected_ids(r: ChatRenderer, text: str) -> list[int]:
    return list(r.tokenizer.encode(text, add_special_tokens=False))


def assert_cut_equal(r: ChatRenderer, recording: Recording, text: str, threads: int) -> None:
    """``r.encode(text)`` is the whole text's encoding and went through one batch of several pieces."""
    recording.batches.clear()
    got = r.encode(text)
    expected = expected_ids(r, text)
    if got != expected:
        k = next(
            (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b), min(len(got), len(expected))
        )
        raise AssertionError(f"{r.name}: ids differ at {k}: {got[k - 3 : k + 3]} vs {expected[k - 3 : k + 3]}")
    assert recording.batches == [len(text_cuts(text, threads)) + 1]
    assert recording.batches[0] > 1, "the text was not cut: this case exercises nothing"


@pytest.fixture
def parallel(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Parallelism on (as the tokenizers library reads it) with a given thread count: ``parallel(n)``."""

    def set_threads(n: int) -> int:
        monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
        monkeypatch.setenv("RAYON_NUM_THREADS", str(n))
        assert parallel_threads() == n
        return n

    return set_threads


@pytest.mark.parametrize("family", BYTE_LEVEL)
def test_cut_encode_equals_encode_on_shipped_tokenizers(renderer_for: Any, family: str, parallel: Any) -> None:
    r = fresh(renderer_for(family))
    recording = recorded(r)
    assert r._text_cut
    rng = random.Random(family)
    for threads in (2, 3, 8):
        parallel(threads)
        for _ in range(6):
            text = fuzzed_text(rng, specials_of(r), rng.randint(threads * TEXT_CUT_MIN_PIECE + 200, 12_000))
            assert_cut_equal(r, recording, text, threads)
    # A tool result of JSON lines, as bench/turns.py makes them, and one past PARALLEL_MIN_CHARS with one special
    # token (the special-token chunking's "few long pieces" case, cut in plain text instead).
    rows = "\n".join(json.dumps({"id": k * 37 % 99991, "name": "bolt crate", "qty": k % 500}) for k in range(200))
    assert_cut_equal(r, recording, rows, parallel(2))
    long = rows * 4 + specials_of(r)[0] + rows
    assert len(long) >= PARALLEL_MIN_CHARS
    assert_cut_equal(r, recording, long, parallel(2))


def test_a_naive_cut_differs(renderer_for: Any) -> None:
    """Cut elsewhere than before the space of ``[a-z] [a-z]``, the pieces give other ids: equality is no accident."""
    r = renderer_for("qwen3")
    text = "the quick brown fox jumps over the lazy dog. " * 60
    whole = expected_ids(r, text)

    def apart(cut: int) -> list[int]:
        return expected_ids(r, text[:cut]) + expected_ids(r, text[cut:])

    assert apart(text.index("quick") + 2) != whole  # inside a word
    assert apart(text.index("quick")) != whole  # after the space (" quick" is one token)
    assert apart(text.index(" dog.") + 3) != whole  # inside " dog" after its space
    assert apart(text.index(" quick")) == whole  # the cut the rule makes


@pytest.mark.parametrize("family", BYTE_LEVEL)
def test_known_patterns_are_the_shipped_ones(renderer_for: Any, family: str) -> None:
    spec = json.loads(renderer_for(family).tokenizer.backend_tokenizer.to_str())
    split = spec["pre_tokenizer"]["pretokenizers"][0]
    assert split["pattern"]["Regex"] == (O200K_PATTERN if family == "gpt-oss" else QWEN2_PATTERN)


@pytest.mark.parametrize("family", ("qwen3", "qwen2.5", "gpt-oss", "mistral-7b-v0.3"))
def test_light_spec_gives_the_same_eligibility_as_tokenizer_json(renderer_for: Any, family: str) -> None:
    backend = renderer_for(family).tokenizer.backend_tokenizer
    full = text_cut_eligible(json.loads(backend.to_str()))
    assert full == text_cut_eligible(light_spec(backend))  # type: ignore[arg-type]
    assert full == (family != "mistral-7b-v0.3")


def test_mistral_is_encoded_whole(renderer_for: Any, parallel: Any) -> None:
    """SentencePiece-style Metaspace: the proof does not cover it, the text is encoded whole."""
    r = fresh(renderer_for("mistral-7b-v0.3"))
    recording = recorded(r)
    assert not r._text_cut
    parallel(2)
    text = fuzzed_text(random.Random(1), specials_of(r), 6000)
    assert r.encode(text) == expected_ids(r, text)
    assert recording.batches == [1]
    # Its components rule the cut out, so its 771 added tokens are never read for it (0.19 ms per encode).
    assert recording.added_token_reads == 0


def test_eligible_components_still_read_the_added_tokens(renderer_for: Any, parallel: Any) -> None:
    """Qwen3's components allow the cut; only its added tokens can still rule it out, so they are read (and the
    added-token test below shows a change to them is seen)."""
    r = fresh(renderer_for("qwen3"))
    recording = recorded(r)
    parallel(2)
    text = "the quick brown fox jumps over the lazy dog " * 60
    assert r.encode(text) == expected_ids(r, text) and recording.batches == [2]
    assert recording.added_token_reads >= 1


@pytest.mark.parametrize("setting", ["false", "0", "off", "NO", ""])
def test_one_thread_encodes_whole(renderer_for: Any, monkeypatch: pytest.MonkeyPatch, setting: str) -> None:
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", setting)
    monkeypatch.setenv("RAYON_NUM_THREADS", "4")
    assert parallel_threads() == 1
    r = fresh(renderer_for("qwen3"))
    recording = recorded(r)
    text = fuzzed_text(random.Random(2), specials_of(r), 6000)
    assert r.encode(text) == expected_ids(r, text)
    assert recording.batches == [1]


def test_parallel_threads_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    monkeypatch.setenv("RAYON_NUM_THREADS", "3")
    assert parallel_threads() == 3
    monkeypatch.setenv("RAYON_NUM_THREADS", "0")  # rayon: 0 is its default, the CPUs this process may use
    assert parallel_threads() == len(os.sched_getaffinity(0))
    monkeypatch.delenv("RAYON_NUM_THREADS")
    monkeypatch.delenv("TOKENIZERS_PARALLELISM")
    assert parallel_threads() == len(os.sched_getaffinity(0))  # unset: parallel


def test_a_forked_child_counts_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """With TOKENIZERS_PARALLELISM unset the tokenizers library may turn parallelism off in a forked child, without
    Python's os.environ seeing it: a child counts one thread. Set explicitly, the setting holds there too."""
    monkeypatch.delenv("TOKENIZERS_PARALLELISM")
    monkeypatch.setenv("RAYON_NUM_THREADS", "4")
    assert parallel_threads() == 4 and not text_cut._FORKED

    def in_child() -> int:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(write, str(parallel_threads()).encode())
            os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        answer = os.read(read, 16)
        os.close(read)
        return int(answer)

    assert in_child() == 1
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    assert in_child() == 4


def variant(renderer_for: Any, edit: Any) -> ChatRenderer:
    """A renderer over a copy of the Qwen3 tokenizer whose tokenizer.json ``edit`` changed (in place)."""
    from transformers import PreTrainedTokenizerFast

    spec = json.loads(renderer_for("qwen3").tokenizer.backend_tokenizer.to_str())
    edit(spec)
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)))
    return ChatRenderer(tok, chat_template="{% for m in messages %}{{ m['content'] }}{% endfor %}")


def set_pattern(pattern: str) -> Any:
    def edit(spec: dict[str, Any]) -> None:
        spec["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = pattern

    return edit


def gpt2_byte_level(add_prefix_space: bool) -> Any:
    def edit(spec: dict[str, Any]) -> None:
        spec["pre_tokenizer"] = {
            "type": "ByteLevel",
            "add_prefix_space": add_prefix_space,
            "trim_offsets": False,
            "use_regex": True,
        }

    return edit


def set_normalizer(kind: str) -> Any:
    def edit(spec: dict[str, Any]) -> None:
        spec["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": kind}]}

    return edit


@pytest.mark.parametrize(
    "edit",
    [set_pattern(CL100K_PATTERN), gpt2_byte_level(False), gpt2_byte_level(True)]
    + [set_normalizer(kind) for kind in ("NFKC", "NFKD")],
    ids=["cl100k", "gpt2", "gpt2-prefix-space", "nfd-nfkc", "nfd-nfkd"],
)
def test_other_accepted_tokenizers(renderer_for: Any, parallel: Any, edit: Any) -> None:
    """cl100k's pattern (o200k's is gpt-oss's), GPT-2's ByteLevel regex (with and without its prefix space) and the
    other Unicode forms, on Qwen3's vocabulary: cut, and the same ids."""
    r = variant(renderer_for, edit)
    recording = recorded(r)
    assert r._text_cut
    rng = random.Random(3)
    for threads in (2, 5):
        parallel(threads)
        for _ in range(5):
            text = fuzzed_text(rng, specials_of(r), rng.randint(threads * TEXT_CUT_MIN_PIECE + 200, 9000))
            assert_cut_equal(r, recording, text, threads)


def test_a_modified_pattern_is_encoded_whole(renderer_for: Any, parallel: Any) -> None:
    """A word that keeps its trailing space ("fox ") would be cut in two by the rule; any pattern not known verbatim
    (even an equivalent one) is encoded whole."""
    trailing = QWEN2_PATTERN.replace(r"[^\r\n\p{L}\p{N}]?\p{L}+", r"[^\r\n\p{L}\p{N}]?\p{L}+ ?")
    r = variant(renderer_for, set_pattern(trailing))
    recording = recorded(r)
    assert not r._text_cut
    parallel(2)
    text = "the quick brown fox jumps over the lazy dog " * 60
    cuts = text_cuts(text, 2)
    assert expected_ids(r, text[: cuts[0]]) + expected_ids(r, text[cuts[0] :]) != expected_ids(r, text)
    assert r.encode(text) == expected_ids(r, text)
    assert recording.batches == [1]


def test_a_pattern_not_known_verbatim_is_encoded_whole(qwen3_light_spec: dict[str, Any]) -> None:
    spec = copy.deepcopy(qwen3_light_spec)
    set_pattern(QWEN2_PATTERN + "|x")(spec)  # equivalent, but not the known text
    assert not text_cut_eligible(spec)


def test_an_added_token_with_a_space_is_encoded_whole(renderer_for: Any, parallel: Any) -> None:
    """An added token "fox jumps" spans a cut point: cutting there would lose the token. Added after a first long
    encode, it is seen (the plan is keyed by the added tokens)."""
    r = variant(renderer_for, lambda spec: None)
    recording = recorded(r)
    parallel(2)
    text = "the quick brown fox jumps over the lazy dog " * 60
    assert r.encode(text) == expected_ids(r, text) and recording.batches == [2]
    r.tokenizer.add_tokens([AddedToken("fox jumps", special=True, normalized=False)], special_tokens=True)
    recording.batches.clear()
    assert not r._text_cut
    at = text.index("fox jumps", len(text) // 2) + len("fox")
    assert expected_ids(r, text[:at]) + expected_ids(r, text[at:]) != expected_ids(r, text)
    assert r.encode(text) == expected_ids(r, text)
    assert recording.batches == [1]


@pytest.mark.parametrize("flag", ["rstrip", "lstrip", "single_word", "normalized"])
def test_an_added_token_with_a_flag_is_encoded_whole(qwen3_light_spec: dict[str, Any], flag: str) -> None:
    """An rstrip token "dog" swallows the space after it, an lstrip one the space before: not covered."""
    spec = copy.deepcopy(qwen3_light_spec)
    assert text_cut_eligible(spec)
    spec["added_tokens"].append({"content": "dog", "special": True, flag: True})
    assert not text_cut_eligible(spec)


@pytest.fixture(scope="module")
def qwen3_light_spec(renderer_for: Any) -> dict[str, Any]:
    """What ``text_cut_eligible`` reads of Qwen3's tokenizer (its tokenizer.json without the vocabulary)."""
    spec = light_spec(renderer_for("qwen3").tokenizer.backend_tokenizer)
    assert spec is not None
    return spec


@pytest.mark.parametrize(
    "edit",
    [
        lambda spec: spec.update(normalizer={"type": "Lowercase"}),
        lambda spec: spec["model"].update(dropout=0.1),
        lambda spec: spec["pre_tokenizer"]["pretokenizers"][0].update(behavior="MergedWithPrevious"),
        lambda spec: spec["pre_tokenizer"]["pretokenizers"][1].update(use_regex=True),
        lambda spec: spec["pre_tokenizer"]["pretokenizers"].append({"type": "Digits", "individual_digits": True}),
    ],
    ids=["lowercase", "dropout", "merged", "byte-level-regex-too", "digits"],
)
def test_other_tokenizers_are_encoded_whole(qwen3_light_spec: dict[str, Any], edit: Any) -> None:
    spec = copy.deepcopy(qwen3_light_spec)
    edit(spec)
    assert not text_cut_eligible(spec)


def test_short_text_is_encoded_whole(renderer_for: Any, parallel: Any) -> None:
    r = fresh(renderer_for("qwen3"))
    recording = recorded(r)
    parallel(2)
    text = ("ab cd " * 1000)[: TEXT_CUT_MIN_CHARS - 1]
    assert r.encode(text) == expected_ids(r, text)
    assert recording.batches == [1]
    assert text_cuts("ab cd" + "1" * 5000, 2) == []  # no cut point: whole


def test_cuts_lie_before_the_space_of_lowercase_letters() -> None:
    rng = random.Random(5)
    for _ in range(200):
        text = fuzzed_text(rng, ["<|im_end|>"], rng.randint(1000, 20_000))
        for pieces in (2, 3, 8):
            cuts = text_cuts(text, pieces)
            assert len(cuts) < pieces and cuts == sorted(set(cuts))
            for cut in cuts:
                assert re.fullmatch("[a-z] [a-z]", text[cut - 1 : cut + 2])
            bounds = [0, *cuts, len(text)]
            assert all(b - a >= TEXT_CUT_MIN_PIECE for a, b in zip(bounds, bounds[1:], strict=False))


@pytest.mark.parametrize("form", ["NFC", "NFD", "NFKC", "NFKD"])
def test_normalization_splits_before_the_space(form: str) -> None:
    """Step 2 of the proof, for every code point ``c`` on either side: NF(c + "a" + " b" + c) is NF(c + "a") then
    NF(" b" + c), the first ending with "a" and the second starting with " "."""
    for code in range(0x110000):
        if 0xD800 <= code <= 0xDFFF:
            continue
        c = chr(code)
        left, right = unicodedata.normalize(form, c + "a"), unicodedata.normalize(form, " b" + c)
        assert unicodedata.normalize(form, c + "a b" + c) == left + right, hex(code)
        assert left.endswith("a") and right.startswith(" "), hex(code)
