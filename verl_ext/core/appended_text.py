"""Every appended message's text reaches the next prompt, or the append is refused.

A template may accept a message and write it elsewhere (DeepSeek gathers every system message at the top of the
conversation, R1-Distill keeps only the last one there) or not at all. Two checks, both on the template's own text:

- **placement**, exact: the same conversation with each appended message's text replaced by a unique marker is
  rendered once per conversation shape (roles, fields, the tool calls before them; cached per renderer), and every
  marker must be written after the assistant turn's boundary. Looking for the real text instead is not enough: a
  short text ("b", "\\n") is found in the markers the template writes around the result (``<｜tool▁output▁begin｜>``)
  while the message itself went to the top;
- **content**: the real text (as is, trimmed or JSON-escaped) is written after the boundary, for a template that
  drops or moves a message depending on what it says.
"""

from __future__ import annotations

import json
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from verl_ext.core.errors import TemplateError
from verl_ext.core.rendering import ChatRenderer, Message

_MARKER = "QXAPPENDED{}QX"
_MAX_SHAPES = 1024  # placement verdicts kept per renderer (a shape is a few roles: few per template)
_PLACED: weakref.WeakKeyDictionary[ChatRenderer, OrderedDict[tuple[Any, ...], str | None]] = weakref.WeakKeyDictionary()


def refuse_dropped_content(
    renderer: ChatRenderer,
    conversation: Sequence[Message],
    n_appended: int,
    tools: Sequence[Mapping[str, Any]] | None,
    add_generation_prompt: bool,
    boundary_text: str,
    head_text: str,
    full_text: str,
) -> None:
    """Refuse (``TemplateError``, naming the message and the fix) when the last ``n_appended`` messages of
    ``conversation`` are not all written after the assistant turn's boundary. ``boundary_text`` is the text of the
    turn's boundary token; ``head_text`` the render of the history before the turn (its copies of ``boundary_text``
    are skipped); ``full_text`` the conversation's render. Compared as template text (no decoding: it holds for
    tokenizers that do not round-trip)."""
    appended = list(conversation[len(conversation) - n_appended :])
    first_index = len(conversation) - n_appended
    skip = head_text.count(boundary_text)
    after = _after_boundary(full_text, boundary_text, skip)
    if after is None:
        return  # the boundary was found by ids; text that does not show it proves nothing either way
    for k, message in enumerate(appended):
        content = _text_of(message.get("content"))
        if content.strip() and not any(form in after for form in _rendered_forms(content)):
            raise _dropped(message, k, content)
    unplaced = _unplaced(renderer, conversation, first_index, tools, add_generation_prompt, boundary_text, skip)
    if unplaced is not None:
        raise _dropped(appended[unplaced], unplaced, _text_of(appended[unplaced].get("content")))


def _dropped(message: Message, k: int, content: str) -> TemplateError:
    return TemplateError(
        f"the chat template does not render the appended {message.get('role')!r} message's text after the "
        f"assistant turn (appended message {k}: it drops it or moves it before the turn, e.g. to the top): "
        f"{content[:60]!r} would never reach the engine. Append this role only if `verl-ext check-template` lists "
        "it as appendable, or send it as a user message"
    )


def _unplaced(
    renderer: ChatRenderer,
    conversation: Sequence[Message],
    first_index: int,
    tools: Sequence[Mapping[str, Any]] | None,
    add_generation_prompt: bool,
    boundary_text: str,
    skip: int,
) -> int | None:
    """The index (among the appended messages) of the first one whose marker the template writes before the
    boundary or not at all, or None. One marker render per conversation shape and renderer."""
    key = _shape_key(conversation, first_index, tools, add_generation_prompt, boundary_text, skip)
    verdicts = _PLACED.setdefault(renderer, OrderedDict())
    if key in verdicts:
        verdicts.move_to_end(key)
        found = verdicts[key]
        return None if found is None else int(found)
    marked = [dict(m) for m in conversation]
    with_marker = []
    for k, m in enumerate(marked[first_index:]):
        replaced = _with_marker(m.get("content"), _MARKER.format(k))
        if replaced is not None:
            m["content"] = replaced
            with_marker.append(k)
        marked[first_index + k] = m
    verdict: str | None = None
    try:
        text = renderer.render_text(marked, tools, add_generation_prompt=add_generation_prompt)
    except TemplateError:
        text = None  # a template that refuses marker text: the content check above is all there is
    if text is not None:
        after = _after_boundary(text, boundary_text, skip)
        if after is not None:
            verdict = next((str(k) for k in with_marker if _MARKER.format(k) not in after), None)
    verdicts[key] = verdict
    while len(verdicts) > _MAX_SHAPES:
        verdicts.popitem(last=False)
    return None if verdict is None else int(verdict)


def _after_boundary(text: str, boundary_text: str, skip: int) -> str | None:
    """``text`` from its (``skip`` + 1)-th copy of ``boundary_text`` on, or None when it holds fewer."""
    at = -1
    for _ in range(skip + 1):
        at = text.find(boundary_text, at + 1)
        if at < 0:
            return None
    return text[at:]


def _shape_key(
    conversation: Sequence[Message],
    first_index: int,
    tools: Sequence[Mapping[str, Any]] | None,
    add_generation_prompt: bool,
    boundary_text: str,
    skip: int,
) -> tuple[Any, ...]:
    """What decides where the template writes the appended messages: every message's role and fields (contents of
    the history too: it is synthetic, a few fixed texts), the appended ones' content kinds, tools and flags."""

    def field(m: Message, k: str) -> str:
        return json.dumps(m.get(k), sort_keys=True, default=str)

    history = tuple(tuple((k, field(m, k)) for k in sorted(m)) for m in conversation[:first_index])
    appended = tuple(
        (
            str(m.get("role")),
            type(m.get("content")).__name__,
            tuple((k, field(m, k)) for k in sorted(m) if k not in ("role", "content")),
        )
        for m in conversation[first_index:]
    )
    tools_key = json.dumps(tools or [], sort_keys=True, default=str)
    return (history, appended, tools_key, add_generation_prompt, boundary_text, skip)


def _with_marker(content: Any, marker: str) -> Any:
    """``content`` with its text replaced by ``marker`` (a string, or the text parts of a list: the first holds the
    marker, the others none), or None when it has no text to place."""
    if isinstance(content, str):
        return marker
    if isinstance(content, Sequence) and not isinstance(content, str | bytes):
        parts = list(content)
        texts = [n for n, p in enumerate(parts) if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
        if not texts:
            return None
        return [{**p, "text": marker if n == texts[0] else ""} if n in texts else p for n, p in enumerate(parts)]
    return None


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return ""


def _rendered_forms(content: str) -> tuple[str, ...]:
    """How a template may write ``content``: as is, trimmed, or JSON-escaped (``| tojson``, HTML-safe or not)."""
    dumped = json.dumps(content, ensure_ascii=False)[1:-1]
    ascii_dumped = json.dumps(content)[1:-1]
    html_safe = (
        ascii_dumped.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026").replace("'", "\\u0027")
    )
    return (content, content.strip(), dumped, ascii_dumped, html_safe)
