"""Templates without their tokenizer (tests/fixtures/templates), rendered over a shipped tokenizer given their markers.

The one way the tests build such a renderer is ``template_renderer``: a template-only file is rendered with a copy of
the shipped Mistral v0.3 tokenizer (SentencePiece-style BPE with byte fallback, ``<s>``/``</s>`` as bos/eos) to which
the markers that template writes (``<|...|>``, ``<｜...｜>``, ``[INST]``-style, ``<x:y>``-style,
``<start_of_turn>``-style) are added as special tokens, as the model's own tokenizer has them. Only that template's
markers: another family's turn markers would be special tokens (and stop-id candidates) its model never has.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenizers import AddedToken

from verl_ext.core.rendering import ChatRenderer

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TEMPLATES_DIR = FIXTURES / "templates"
TOKENIZERS_DIR = FIXTURES / "tokenizers"
BASE_TOKENIZER = "mistral-7b-v0.3"

_MARKER = re.compile(
    r"<\|[^<>|\s]+\|>"  # <|eot_id|>, <|im_end|>, <|tool_call_end|>
    r"|<｜[^｜<>]+｜>"  # DeepSeek's full-width <｜end▁of▁sentence｜>, <｜tool▁call▁end｜>
    r"|\[/?[A-Z_]+\]"  # [INST], [/INST], [TOOL_CALLS]
    r"|</?[a-z_]+:[a-z_]+>"  # <seed:bos>, </seed:think>
    r"|<[a-z]+_of_[a-z]+>"  # <start_of_turn>, <end_of_turn>
)
# Whitespace runs and HTML tags Gemma's vocabulary holds as non-special added tokens, plus its turn markers.
GEMMA_SPECIAL = ("<start_of_turn>", "<end_of_turn>")
GEMMA_PLAIN = ("\n", "\n\n", "  ", "   ", "</div>", "<table>", "<br>")

# Templates whose markers need another base: a SentencePiece (Metaspace) decoder turns the "▁" in DeepSeek's markers
# into spaces, so they go on the byte-level Qwen3 tokenizer (DeepSeek's own is byte-level BPE), with its bos and eos.
BASES: dict[str, tuple[str, str | None, str | None]] = {
    "deepseek-ai-DeepSeek-V3": ("qwen3", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-ai-DeepSeek-V3.1": ("qwen3", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("qwen3", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
}

# Variables a template needs from the caller (what a user passes as template kwargs), by file stem.
TEMPLATE_KWARGS: dict[str, dict[str, str]] = {
    "fireworks-ai-llama-3-firefunction-v2": {"functions": "[]", "datetime": "2026-01-01"},
}


def template_files() -> list[Path]:
    return sorted(TEMPLATES_DIR.glob("*.jinja"))


# Every template the per-template tests run: the shipped tokenizers, Qwen3's variants, the fixture templates.
SHIPPED = ("qwen3", "qwen2.5", "gpt-oss", "mistral-7b-v0.3")
QWEN3_EXTRAS = (
    "qwen3-2504-original",
    "qwen3-coder-30b-a3b-instruct_ollama-gguf",
    "qwen3-next-80b-a3b-instruct_ollama-gguf",
    "qwq-32b",
)
TEMPLATE_CASES = [
    *SHIPPED,
    *(f"qwen3/{name}" for name in QWEN3_EXTRAS),
    *(f"templates/{p.stem}" for p in template_files()),
]
# Two tool schemas the per-template tests render.
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": "A test tool.",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
        },
    }
    for name in ("calculator", "search")
]


def template_path(name: str) -> Path:
    """``tests/fixtures/templates/<name>`` (``name`` with or without ``.jinja``); a clear error for a wrong name."""
    path = TEMPLATES_DIR / (name if name.endswith(".jinja") else f"{name}.jinja")
    if not path.is_file():
        raise FileNotFoundError(f"no fixture template {name!r}; known: {[p.stem for p in template_files()]}")
    return path


def markers(template: str) -> list[str]:
    """The special-looking markers a template writes, in first-seen order ("<|NONE|>"-style sentinels included)."""
    return list(dict.fromkeys(_MARKER.findall(template)))


def _base_dir(base: str) -> Path:
    from verl_ext.demo.run import shipped_tokenizers

    return shipped_tokenizers()[base]


_LOADED: dict[Path, Any] = {}


def tokenizer_with(base_dir: Path, special: Sequence[str], plain: Sequence[str] = ()) -> Any:
    """A fresh copy of a shipped tokenizer with extra special and non-special added tokens (the base folder is
    loaded once per process; each call returns its own copy, so tests never see each other's tokens)."""
    if base_dir not in _LOADED:
        from transformers import AutoTokenizer

        os.environ["HF_HUB_OFFLINE"] = "1"
        _LOADED[base_dir] = AutoTokenizer.from_pretrained(str(base_dir))
    tok = copy.deepcopy(_LOADED[base_dir])
    vocab = tok.get_vocab()  # a second each on a 150k vocabulary: read once, not per token
    new = [s for s in dict.fromkeys(special) if s not in vocab]
    tok.add_tokens([AddedToken(s, special=True, normalized=False) for s in new], special_tokens=True)
    if plain:
        tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in plain])
    return tok


# One built tokenizer per fixture template and token set, per process: building one copies a 150k-vocabulary tokenizer
# (seconds), and the renderers only read it (ChatRenderer takes the template as its own argument).
_TEMPLATE_TOKENIZERS: dict[tuple[str, str, tuple[str, ...], tuple[str, ...]], Any] = {}


def template_renderer(
    name: str,
    template_kwargs: Mapping[str, Any] | None = None,
    *,
    extra_special: Sequence[str] = (),
    plain: Sequence[str] = (),
    base: str | None = None,
) -> ChatRenderer:
    """A renderer for the fixture template ``name`` over a shipped tokenizer (``base``; default Mistral v0.3, or the
    template's entry in ``BASES``) carrying that template's markers (plus ``extra_special`` special and ``plain``
    non-special added tokens). ``template_kwargs`` default to what the template needs (``TEMPLATE_KWARGS``)."""
    path = template_path(name)
    text = path.read_text(encoding="utf-8")
    default_base, bos, eos = BASES.get(path.stem, (BASE_TOKENIZER, None, None))
    base = base or default_base
    key = (base, path.stem, tuple(extra_special), tuple(plain))
    tok = _TEMPLATE_TOKENIZERS.get(key)
    if tok is None:
        tok = tokenizer_with(_base_dir(base), [*markers(text), *extra_special], plain)
        if bos is not None and eos is not None:
            tok.add_special_tokens({"bos_token": bos, "eos_token": eos})
        tok.name_or_path = f"{base}+{path.stem}"
        _TEMPLATE_TOKENIZERS[key] = tok
    kwargs = TEMPLATE_KWARGS.get(path.stem, {}) if template_kwargs is None else template_kwargs
    return ChatRenderer(tok, chat_template=text, template_kwargs=kwargs)
