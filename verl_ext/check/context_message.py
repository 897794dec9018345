"""Findings about a context message: name the message that differs, in its turn, and never print equal texts.

A user, tool or system message edited in what the check is given (the stream holds what the engine saw) is a
divergence in tokens verl_ext did not sample. The template view's rules leave it unnamed (``unknown``) or, where the
alignment lays it against a sampled turn next to it, read it as that turn's message (``message_differs``). Here such
a finding is matched to the context message whose text holds the template's side and not the stream's, and becomes
``context_differs``: that message's index and role, the turn after which it was appended. Where a finding's two
texts print alike (another token split of the same text, invisible characters), its detail gets both sides' ids and
tokens, so a difference is never shown as two equal strings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from verl_ext.check.findings import Cause, Finding
from verl_ext.check.locate import Locator
from verl_ext.check.texts_alike import alike_note

_RENAMED = (Cause.UNKNOWN, Cause.MESSAGE_DIFFERS)


def name_context_messages(
    findings: Sequence[Finding],
    loc: Locator,
    messages: Sequence[Mapping[str, Any]],
    allowed: Callable[[Cause], bool],
) -> list[Finding]:
    """``findings``, each ``unknown`` or ``message_differs`` one that is a context message's edit renamed
    ``context_differs`` (in the turn after which that message was appended)."""
    out = []
    for f in findings:
        at = _edited_message(f, loc, messages) if f.cause in _RENAMED and not f.allowed else None
        if at is None:
            out.append(f)
            continue
        role = messages[at].get("role")
        turn = max((k for k, i in enumerate(loc.assistant_indices) if i < at), default=0)
        detail = (
            f"message {at} ({role}) is not what the engine saw: the stream holds {f.stream_text!r} where the "
            f"message renders {f.rendered_text!r} (the loop's messages were changed after the engine saw them)"
        )
        out.append(
            dataclasses.replace(
                f,
                cause=Cause.CONTEXT_DIFFERS,
                allowed=allowed(Cause.CONTEXT_DIFFERS),
                turn=turn,
                detail=detail + alike_note(loc.renderer, f.stream_ids, f.rendered_ids, f.stream_text, f.rendered_text),
            )
        )
    return out


def _edited_message(f: Finding, loc: Locator, messages: Sequence[Mapping[str, Any]]) -> int | None:
    """The index of the one non-assistant message whose text holds the finding's rendered text, where both sides are
    plain text (no control token on either side) and differ; else None."""
    control = loc.renderer.control_ids
    if any(i in control for i in (*f.stream_ids, *f.rendered_ids)):
        return None
    rendered, stream = f.rendered_text.strip(), f.stream_text.strip()
    if not rendered or rendered == stream:
        return None
    found = [i for i, m in enumerate(messages) if m.get("role") != "assistant" and rendered in _text(m.get("content"))]
    if f.cause is Cause.MESSAGE_DIFFERS and f.turn < len(loc.assistant_indices):
        own = _text(messages[loc.assistant_indices[f.turn]].get("content"))
        if rendered in own:
            return None  # the sampled turn's own message holds it: the finding is about that message
    return found[0] if len(found) == 1 else None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return ""
