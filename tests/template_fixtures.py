"""Templates without their tokenizer (tests/fixtures/templates) over a shipped tokenizer given their markers.

A template-only file is rendered with the shipped Mistral v0.3 tokenizer (SentencePiece-style BPE with byte
fallback, ``<s>``/``</s>`` as bos/eos) to which every marker the template writes (``<|...|>``, ``[INST]``-style,
``<x:y>``-style, ``<start_of_turn>``-style) is added as a special token, as the model's own tokenizer has them.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from tokenizers import AddedToken

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TEMPLATES_DIR = FIXTURES / "templates"
BASE_TOKENIZER = "mistral-7b-v0.3"

_MARKER = re.compile(r"<\|[^<>|\s]+\|>|\[/?[A-Z_]+\]|</?[a-z_]+:[a-z_]+>|<[a-z]+_of_[a-z]+>")
# Whitespace runs and HTML tags Gemma's vocabulary holds as non-special added tokens, plus its turn markers.
GEMMA_SPECIAL = ("<start_of_turn>", "<end_of_turn>")
GEMMA_PLAIN = ("\n", "\n\n", "  ", "   ", "</div>", "<table>", "<br>")


# Variables a template needs from the caller (what a user passes as template kwargs), by file stem.
TEMPLATE_KWARGS: dict[str, dict[str, str]] = {
    "fireworks-ai-llama-3-firefunction-v2": {"functions": "[]", "datetime": "2026-01-01"},
}


def template_files() -> list[Path]:
    return sorted(TEMPLATES_DIR.glob("*.jinja"))


def markers(template: str) -> list[str]:
    """The special-looking markers a template writes, in first-seen order ("<|NONE|>"-style sentinels included)."""
    return list(dict.fromkeys(_MARKER.findall(template)))


def tokenizer_with(base_dir: Path, special: list[str] | tuple[str, ...], plain: tuple[str, ...] = ()) -> Any:
    """A fresh copy of a shipped tokenizer with extra special and non-special added tokens."""
    from transformers import AutoTokenizer

    os.environ["HF_HUB_OFFLINE"] = "1"
    tok = AutoTokenizer.from_pretrained(str(base_dir))
    tok.add_tokens([AddedToken(s, special=True, normalized=False) for s in special], special_tokens=True)
    if plain:
        tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in plain])
    return tok
