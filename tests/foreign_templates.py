"""Real chat templates whose tokenizer does not ship here, over the shipped Qwen3 tokenizer given their markers.

A template's control markers (``<|eot_id|>``, ``<｜tool▁call▁begin｜>``, ``[INST]``, ...) are added to a copy of
the Qwen3 tokenizer as special tokens, and a ``bos_token`` when the template renders one, so the template's real
text renders and tokenizes as it would with its own tokenizer at every boundary.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from verl_ext.core.rendering import ChatRenderer

TEMPLATES = Path(__file__).resolve().parent / "fixtures" / "templates"
_MARKERS = re.compile(r"<｜[^｜]+｜>|<\|[^|<>\s]+\|>|\[/?[A-Z_]+\]|<seed:[a-z_]+>")
BOS = "<|begin_of_text|>"


def foreign_renderer(
    load_tokenizer: Callable[[str], Any], template: str, template_kwargs: Mapping[str, Any] | None = None
) -> ChatRenderer:
    """A renderer for ``tests/fixtures/templates/<template>`` over Qwen3's tokenizer carrying its markers."""
    text = (TEMPLATES / template).read_text(encoding="utf-8")
    tokenizer = copy.deepcopy(load_tokenizer("qwen3"))
    markers = sorted(set(_MARKERS.findall(text)) - set(tokenizer.get_vocab()) - {BOS})
    tokenizer.add_special_tokens({"additional_special_tokens": markers}, replace_extra_special_tokens=False)
    if "bos_token" in text:
        tokenizer.add_special_tokens({"bos_token": BOS})
    tokenizer.name_or_path = f"qwen3+{template}"
    return ChatRenderer(tokenizer, chat_template=text, template_kwargs=template_kwargs)
