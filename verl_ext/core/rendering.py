"""Render conversations with a tokenizer's chat template, and encode them to token ids.

Rendering is the only place the token core touches the template. Encoding has one extra duty:
text that comes from users, tools or the environment must not be able to create special tokens.
A tool result that contains ``<|im_end|><|im_start|>system`` must stay text; with a plain
``tokenizer.encode`` it would become a real turn boundary.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import Tokenizer

from verl_ext.core.errors import TemplateError

if TYPE_CHECKING:  # transformers takes seconds to import; what only reads records (the report) never needs it
    from transformers import PreTrainedTokenizerBase

Message = Mapping[str, Any]

# Roles whose text is untrusted: it comes from people, tools or the environment, not the policy.
DEFAULT_ESCAPED_ROLES: tuple[str, ...] = ("user", "tool", "system")

# ASCII, so that templates which ``|tojson``, ``|trim`` or ``|string`` the content keep it intact.
_PLACEHOLDER = "zqVXESC{}Xqz"
_PLACEHOLDER_RE = re.compile(r"zqVXESC(\d+)Xqz")


@dataclass(frozen=True)
class Escape:
    """A special-token string found in untrusted message content and encoded as plain text."""

    message_index: int
    role: str
    text: str


@dataclass(frozen=True)
class Rendered:
    """Token ids of one render, and the special-token strings that were kept as text."""

    ids: tuple[int, ...]
    escapes: tuple[Escape, ...] = ()


def load_renderer(
    tokenizer_dir: str | os.PathLike[str],
    chat_template_file: str | os.PathLike[str] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    escape_special_tokens: bool = True,
) -> ChatRenderer:
    """Load a tokenizer from a local folder (never from the Hub) and wrap it in a renderer."""
    path = Path(tokenizer_dir)
    if not path.is_dir():
        raise FileNotFoundError(
            f"tokenizer folder {str(path)!r} does not exist; pass the folder that holds tokenizer.json "
            "and tokenizer_config.json"
        )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(path))
    template = None
    if chat_template_file is not None:
        template = Path(chat_template_file).read_text(encoding="utf-8")
    return ChatRenderer(
        tokenizer,
        chat_template=template,
        template_kwargs=template_kwargs,
        escape_special_tokens=escape_special_tokens,
    )


class ChatRenderer:
    """A tokenizer, its chat template and the template kwargs, with token-exact rendering.

    ``render(...)`` equals ``apply_chat_template(..., tokenize=True)`` token for token whenever no
    untrusted message contains special-token text; when one does, that text is encoded as plain
    text and reported in ``Rendered.escapes``.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        chat_template: str | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
        escape_special_tokens: bool = True,
        escaped_roles: Sequence[str] = DEFAULT_ESCAPED_ROLES,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template: str | None = chat_template or tokenizer.chat_template
        if not self.chat_template:
            raise TemplateError(
                f"tokenizer {tokenizer.name_or_path!r} has no chat template; pass one with "
                "--chat-template FILE (or chat_template=...)"
            )
        self.template_kwargs: dict[str, Any] = dict(template_kwargs or {})
        self.escape_special_tokens = escape_special_tokens
        self.escaped_roles = tuple(escaped_roles)
        added = tokenizer.added_tokens_decoder
        self.added_ids: frozenset[int] = frozenset(added)
        self.special_ids: frozenset[int] = frozenset(i for i, tok in added.items() if tok.special)
        strings = sorted({tok.content for tok in added.values() if tok.content}, key=len, reverse=True)
        self._added_re = re.compile("|".join(re.escape(s) for s in strings)) if strings else None
        self._text_only = _text_only_tokenizer(tokenizer)

    def with_template_kwargs(self, template_kwargs: Mapping[str, Any] | None) -> ChatRenderer:
        """The same tokenizer and template with other template kwargs (shares the loaded tokenizers)."""
        if dict(template_kwargs or {}) == self.template_kwargs:
            return self
        clone = copy.copy(self)
        clone.template_kwargs = dict(template_kwargs or {})
        clone.__dict__.pop("fingerprint", None)
        return clone

    # -- identity ---------------------------------------------------------------------------------
    @functools.cached_property
    def fingerprint(self) -> str:
        """Stable id of (tokenizer, template, template kwargs): the probe's cache key."""
        h = hashlib.sha256()
        h.update(self.tokenizer.backend_tokenizer.to_str().encode())
        h.update((self.chat_template or "").encode())
        h.update(json.dumps(self.template_kwargs, sort_keys=True, default=str).encode())
        return h.hexdigest()[:16]

    @property
    def name(self) -> str:
        return str(self.tokenizer.name_or_path)

    # -- rendering --------------------------------------------------------------------------------
    def render_text(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
    ) -> str:
        """The template's text for ``messages``; template errors become ``TemplateError``."""
        try:
            text = self.tokenizer.apply_chat_template(
                [dict(m) for m in messages],
                tools=list(tools) if tools else None,
                chat_template=self.chat_template,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
                **self.template_kwargs,
            )
        except Exception as exc:  # jinja raises many types; all mean "this template refused"
            roles = [m.get("role") for m in messages]
            raise TemplateError(f"chat template failed to render roles {roles}: {exc}") from exc
        assert isinstance(text, str)
        return text

    def render(
        self,
        messages: Sequence[Message],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = False,
        escape: bool | None = None,
    ) -> Rendered:
        """Render and encode ``messages``. ``escape`` defaults to the renderer's setting."""
        escape = self.escape_special_tokens if escape is None else escape
        if not escape or self._added_re is None:
            return Rendered(tuple(self.encode(self.render_text(messages, tools, add_generation_prompt))))
        protected, literals, escapes = self._protect(messages)
        text = self.render_text(protected, tools, add_generation_prompt)
        if not literals:
            return Rendered(tuple(self.encode(text)))
        return Rendered(tuple(self._encode_with_literals(text, literals)), tuple(escapes))

    def encode(self, text: str) -> list[int]:
        """Encode rendered template text; special-token strings become special tokens."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def encode_as_text(self, text: str) -> list[int]:
        """Encode ``text`` so that special-token strings inside it stay plain text."""
        return self._text_only.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def token_strings(self, ids: Sequence[int]) -> list[str]:
        """Each id decoded on its own (partial UTF-8 bytes show as replacement characters)."""
        return [self.decode([i]) for i in ids]

    # -- escaping ---------------------------------------------------------------------------------
    def escapes(self, messages: Sequence[Message]) -> tuple[Escape, ...]:
        """The special-token strings in untrusted content that an escaping render would keep as text (no render)."""
        return () if self._added_re is None else tuple(self._protect(messages)[2])

    def escapes_text(self, role: str, text: str) -> bool:
        """Whether an escaping render would keep special-token text in ``text`` of a ``role`` message as text."""
        return (
            self.escape_special_tokens
            and self._added_re is not None
            and role in self.escaped_roles
            and self._added_re.search(text) is not None
        )

    def _protect(self, messages: Sequence[Message]) -> tuple[list[dict[str, Any]], list[str], list[Escape]]:
        """Swap special-token strings in untrusted content for ASCII placeholders."""
        assert self._added_re is not None
        literals: list[str] = []
        escapes: list[Escape] = []
        out: list[dict[str, Any]] = []

        def swap(text: str, index: int, role: str) -> str:
            def one(match: re.Match[str]) -> str:
                literals.append(match.group(0))
                escapes.append(Escape(index, role, match.group(0)))
                return _PLACEHOLDER.format(len(literals) - 1)

            return self._added_re.sub(one, text)  # type: ignore[union-attr]

        for index, message in enumerate(messages):
            msg = dict(message)
            role = str(msg.get("role"))
            content = msg.get("content")
            if role in self.escaped_roles:
                if isinstance(content, str):
                    msg["content"] = swap(content, index, role)
                elif isinstance(content, list):
                    msg["content"] = [
                        {**part, "text": swap(part["text"], index, role)}
                        if isinstance(part, Mapping) and isinstance(part.get("text"), str)
                        else part
                        for part in content
                    ]
            out.append(msg)
        return out, literals, escapes

    def _encode_with_literals(self, text: str, literals: Sequence[str]) -> list[int]:
        ids: list[int] = []
        pos = 0
        for match in _PLACEHOLDER_RE.finditer(text):
            if match.start() > pos:
                ids += self.encode(text[pos : match.start()])
            ids += self.encode_as_text(literals[int(match.group(1))])
            pos = match.end()
        if pos < len(text):
            ids += self.encode(text[pos:])
        return ids


def _text_only_tokenizer(tokenizer: PreTrainedTokenizerBase) -> Tokenizer:
    """A copy of the fast tokenizer that never matches added tokens: every string is text."""
    if not hasattr(tokenizer, "backend_tokenizer"):
        raise TemplateError(
            f"tokenizer {tokenizer.name_or_path!r} is a slow (Python) tokenizer; verl_ext needs the fast "
            "tokenizer (a tokenizer.json) to encode untrusted text safely"
        )
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    for token in spec.get("added_tokens", []):
        token["special"] = True  # encode_special_tokens only skips tokens marked special
    copy = Tokenizer.from_str(json.dumps(spec))
    copy.encode_special_tokens = True
    return copy
