"""The text-only tokenizer (every string is text, no added token matched) built around the original's model encodes
and decodes exactly as the copy rebuilt from the tokenizer's JSON, on every shipped tokenizer; where the added tokens
would not come back with their ids, the JSON copy is built instead."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from verl_ext.core.text_only_tokenizer import text_only_sharing_the_model, text_only_tokenizer

SHIPPED = ["qwen3", "qwen2.5", "gpt-oss", "mistral-7b-v0.3"]
ODD = ["\n", "  ", "\t", "\u00a0", "é", "e\u0301", "你好", "\U0001f600", '{"a": 1}', "▁", "<", "|>", "[INST]"]


def rebuilt_from_json(backend: Tokenizer) -> Tokenizer:
    """The reference: the whole tokenizer rebuilt from its JSON with every added token marked special."""
    spec = json.loads(backend.to_str())
    for token in spec.get("added_tokens", []):
        token["special"] = True
    copy = Tokenizer.from_str(json.dumps(spec))
    copy.encode_special_tokens = True
    return copy


@pytest.fixture(scope="module")
def pairs(load_tokenizer: Any) -> dict[str, tuple[Tokenizer, Tokenizer, list[str]]]:
    out = {}
    for name in SHIPPED:
        backend = load_tokenizer(name).backend_tokenizer
        shared = text_only_sharing_the_model(backend)
        assert shared is not None, f"{name}: the added tokens did not come back with their ids"
        added = [t.content for t in backend.get_added_tokens_decoder().values()]
        out[name] = (shared, rebuilt_from_json(backend), added)
    return out


@pytest.mark.parametrize("name", SHIPPED)
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_the_shared_copy_encodes_and_decodes_as_the_rebuilt_one(pairs, name, data) -> None:
    shared, reference, added = pairs[name]
    pieces = data.draw(st.lists(st.sampled_from(added) | st.sampled_from(ODD) | st.text(max_size=12), max_size=12))
    text = "".join(pieces)
    ids = shared.encode(text, add_special_tokens=False).ids
    assert ids == reference.encode(text, add_special_tokens=False).ids, text
    for token in added:
        if token in text:
            assert shared.token_to_id(token) not in ids, f"{token!r} was matched as a token, not encoded as text"
    assert shared.decode(ids, skip_special_tokens=False) == reference.decode(ids, skip_special_tokens=False)


def test_added_tokens_that_would_change_id_take_the_json_copy() -> None:
    """An added token that would not come back with its own id (the tokenizers library renumbers the ones it loads,
    so this is a backend whose table says otherwise) is never shared: the caller builds the JSON copy."""
    backend = Tokenizer(WordLevel({"[UNK]": 0, "a": 1, "b": 2}, unk_token="[UNK]"))
    backend.pre_tokenizer = Whitespace()
    backend.add_tokens([AddedToken("<x>", special=False)])
    assert text_only_sharing_the_model(backend) is not None  # as loaded: <x> comes back as 3
    table = {7: AddedToken("<x>", special=False)}  # what an id the library would not give again looks like
    renumbered = SimpleNamespace(
        model=backend.model,
        normalizer=backend.normalizer,
        pre_tokenizer=backend.pre_tokenizer,
        decoder=backend.decoder,
        post_processor=backend.post_processor,
        get_added_tokens_decoder=lambda: table,
    )
    assert text_only_sharing_the_model(renumbered) is None
    text_only = text_only_tokenizer(SimpleNamespace(backend_tokenizer=backend, name_or_path="small"))
    assert text_only.encode("a <x>", add_special_tokens=False).ids == [1, 0, 0, 0]  # "<", "x", ">": text, unknown
