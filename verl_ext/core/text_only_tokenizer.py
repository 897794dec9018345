"""A copy of a fast tokenizer that never matches added tokens: every string is text. ``ChatRenderer`` encodes
untrusted text with it, so a message cannot create a special token by writing its string.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from tokenizers import AddedToken, Tokenizer

from verl_ext.core.errors import TemplateError

if TYPE_CHECKING:  # transformers takes seconds to import
    from transformers import PreTrainedTokenizerBase


def text_only_tokenizer(tokenizer: PreTrainedTokenizerBase) -> Tokenizer:
    """A copy of the fast tokenizer that never matches added tokens: every string is text."""
    if not hasattr(tokenizer, "backend_tokenizer"):
        raise TemplateError(
            f"tokenizer {tokenizer.name_or_path!r} is a slow (Python) tokenizer; verl_ext needs the fast "
            "tokenizer (a tokenizer.json) to encode untrusted text safely"
        )
    backend = tokenizer.backend_tokenizer
    shared = text_only_sharing_the_model(backend)
    if shared is not None:
        return shared
    spec = json.loads(backend.to_str())
    for token in spec.get("added_tokens", []):
        token["special"] = True  # encode_special_tokens only skips tokens marked special
    copy = Tokenizer.from_str(json.dumps(spec))
    copy.encode_special_tokens = True
    return copy


def text_only_sharing_the_model(backend: Tokenizer) -> Tokenizer | None:
    """The text-only copy built around the original's model (read-only, shared): 1-4 s less than rebuilding it from
    JSON on a 150k-token vocabulary, paid by every command and worker that loads a tokenizer. None where the added
    tokens do not come back with their own ids (then the JSON copy is built). The copy has no truncation or padding:
    it encodes whole texts."""
    added = sorted(backend.get_added_tokens_decoder().items())
    copy = Tokenizer(backend.model)
    copy.normalizer, copy.pre_tokenizer, copy.decoder = backend.normalizer, backend.pre_tokenizer, backend.decoder
    copy.post_processor = backend.post_processor
    copy.add_special_tokens(
        [
            AddedToken(
                t.content,
                single_word=t.single_word,
                lstrip=t.lstrip,
                rstrip=t.rstrip,
                normalized=t.normalized,
                special=True,  # encode_special_tokens only skips tokens marked special
            )
            for _, t in added
        ]
    )
    if any(copy.token_to_id(t.content) != i for i, t in added):
        return None
    copy.encode_special_tokens = True
    return copy
