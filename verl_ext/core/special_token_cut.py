"""Where a text can be cut at special-token strings and its pieces encoded apart, in parallel, with the ids of
encoding it whole: ``chunking_plan`` proves it from a tokenizer's spec (tokenizer.json's shape); ``light_spec`` reads
that spec off a loaded backend without serialising its vocabulary. ``ChatRenderer.encode`` (``core/rendering.py``)
uses the plan; the plain-text cut between special tokens is ``core/text_cut.py``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from tokenizers import Tokenizer

from verl_ext.core.literal_regex import literal_alternation
from verl_ext.core.text_cut import only_types, spec_components

# Backend parts that treat each piece between added tokens on its own (the tokenizers library normalizes and
# pre-tokenizes every such piece apart, and the model sees words), so cutting the text there changes nothing.
# Anything else (a component this list does not name) keeps the text whole. Metaspace is here with a condition: one
# that marks only the input's start ("first") looks at where a piece lies in the whole text (``chunking_plan``).
_PIECEWISE_NORMALIZERS = frozenset(
    {"NFC", "NFD", "NFKC", "NFKD", "Lowercase", "Strip", "StripAccents", "Replace", "Prepend", "Precompiled", "Nmt"}
)
_PIECEWISE_PRE_TOKENIZERS = frozenset(
    {"Split", "ByteLevel", "Metaspace", "Whitespace", "WhitespaceSplit", "Digits", "Punctuation", "BertPreTokenizer"}
)


def chunking_plan(spec: Mapping[str, Any]) -> tuple[re.Pattern[str], bool] | None:
    """How text can be cut for a parallel encode with the tokenizer ``spec`` (a tokenizer.json, parsed), giving the
    ids of encoding it whole: (a pattern that matches, and captures, the special-token strings to cut at; whether
    pieces after the first need a tokenizer that does not mark the input's start); None when it cannot be shown.

    The tokenizers library first cuts the text at added-token strings (leftmost, then longest), then normalizes,
    pre-tokenizes and encodes each piece apart. Cutting at a special-token string ``s`` gives the same pieces when
    that scan matches every occurrence of ``s`` exactly: when no added token contains ``s`` (other than ``s``
    itself) and none ends with a proper prefix of ``s`` (so no match can run into it; ``s`` itself included).
    Refused outright: added tokens matched after normalization or with lstrip/rstrip/single_word (their match
    depends on text around them), BPE dropout (random splits), components not known to work piece by piece.
    """
    model = spec.get("model") or {}
    if model.get("dropout") not in (None, 0, 0.0):
        return None
    if not only_types(spec.get("normalizer"), "normalizers", _PIECEWISE_NORMALIZERS):
        return None
    pre = spec.get("pre_tokenizer")
    if not only_types(pre, "pretokenizers", _PIECEWISE_PRE_TOKENIZERS):
        return None
    metaspaces = [p for p in spec_components(pre, "pretokenizers") if p.get("type") == "Metaspace"] if pre else []
    schemes = [p.get("prepend_scheme") for p in metaspaces]
    if any(scheme not in ("always", "never", "first") for scheme in schemes):
        return None  # an older file's add_prefix_space, or a scheme this code does not know
    added = [t for t in spec.get("added_tokens") or [] if isinstance(t, Mapping)]
    if any(t.get(flag) for t in added for flag in ("normalized", "lstrip", "rstrip", "single_word")):
        return None
    contents = [str(t.get("content") or "") for t in added]
    candidates = {c for t, c in zip(added, contents, strict=True) if t.get("special") and c}
    unsafe: set[str] = set()
    prefixes: dict[str, set[str]] = {}
    for s in candidates:
        for k in range(1, len(s)):
            prefixes.setdefault(s[:k], set()).add(s)
    for t in contents:
        for i in range(len(t)):
            unsafe |= prefixes.get(t[i:], set()) if i else set()  # t runs into s: a suffix of t starts s
            for j in range(i + 1, len(t) + 1):
                if (i, j) != (0, len(t)) and t[i:j] in candidates:
                    unsafe.add(t[i:j])  # t holds s: the scan can match t over it
    cuts = candidates - unsafe
    if not cuts:
        return None
    pattern = re.compile("(" + literal_alternation(cuts) + ")")  # the longest where several start, in any order
    return pattern, "first" in schemes


def _state(component: Any) -> bytes | None:
    """A normalizer's or pre-tokenizer's serialised state, JSON (None for none); raises for a custom Python one."""
    return None if component is None else bytes(component.__getstate__())


def components_key(backend: Tokenizer) -> tuple[Any, ...]:
    """The state of a backend's components that the plans read, but its added tokens: the normalizer's,
    pre-tokenizer's and post-processor's, the model's kind and dropout. Raises for a custom Python component."""
    model = backend.model
    return (
        _state(backend.normalizer),
        _state(backend.pre_tokenizer),
        _state(backend.post_processor),
        type(model).__name__,
        getattr(model, "dropout", None),
    )


def light_spec(backend: Tokenizer, with_added_tokens: bool = True) -> dict[str, Any] | None:
    """What ``chunking_plan`` and ``text_cut_eligible`` read of a backend, in tokenizer.json's shape, without
    serialising its vocabulary (nor reading its added tokens, with ``with_added_tokens=False``: an empty list); None
    when a component cannot be serialised (a custom Python normalizer or pre-tokenizer: the text is encoded whole)."""

    def part(component: Any) -> Any:
        state = _state(component)
        return None if state is None else json.loads(state)

    added = [
        {
            "content": t.content,
            "special": t.special,
            **{flag: getattr(t, flag) for flag in ("normalized", "lstrip", "rstrip", "single_word")},
        }
        for t in (backend.get_added_tokens_decoder().values() if with_added_tokens else ())
    ]
    model = {"type": type(backend.model).__name__, "dropout": getattr(backend.model, "dropout", None)}
    try:
        normalizer, pre_tokenizer = part(backend.normalizer), part(backend.pre_tokenizer)
        post_processor = part(backend.post_processor)
    except Exception:  # the tokenizers library refuses to serialise a custom component (its error type varies)
        return None
    return {
        "normalizer": normalizer,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "model": model,
        "added_tokens": added,
    }


def no_start_marker(pre_tokenizer: Any) -> bool:
    """Switch a Metaspace pre-tokenizer that marks only the input's start (prepend_scheme "first") to "never", in
    place, also inside a Sequence; True when one was switched."""
    if not isinstance(pre_tokenizer, dict):
        return False
    if pre_tokenizer.get("type") == "Sequence":
        return any([no_start_marker(p) for p in pre_tokenizer.get("pretokenizers") or []])
    if pre_tokenizer.get("type") == "Metaspace" and pre_tokenizer.get("prepend_scheme") == "first":
        pre_tokenizer["prepend_scheme"] = "never"
        return True
    return False
