"""Why a template cannot append a message, named by its cause, with the fix.

What the probe first meets on such a template is a symptom ("no special token follows the assistant turn"). Two
causes explain it on real templates, and each is read from renders of the probe's own conversations, never from a
model's name:

* the template's turn markers are not tokens of this tokenizer (a template of another model, or a folder whose
  template and tokenizer.json come from two models): each marker encodes as pieces of plain text, so no token can
  end a turn;
* the template writes a turn's close only after several tool calls: the close sits in the branch of its loop for
  the second and later calls (an upstream template bug), so a turn with a single call has no close.

A template that raises its own error for a tool message has no tool turn at all: the reason says so, with the fix.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from verl_ext.core.errors import TemplateError

# Strings shaped like a chat template's structural markers: <|eot_id|>, <｜end▁of▁sentence｜>, [INST], <seed:bos>,
# <start_of_turn>.
MARKER = re.compile(
    r"<\|[^<>|\s]+\|>"
    r"|<｜[^｜<>]+｜>"
    r"|\[/?[A-Z][A-Z_]*\]"
    r"|</?[a-z_]+:[a-z_]+>"
    r"|<[a-z]+_of_[a-z]+>"
)
_SHOWN = 4  # markers named in a reason; the rest are counted


def foreign_markers(renderer: Any, text: str) -> list[str]:
    """Marker-shaped strings in ``text`` that are not one token of ``renderer``'s tokenizer, in first-seen order."""
    return [m for m in dict.fromkeys(MARKER.findall(text)) if len(renderer.encode(m)) != 1]


def explain_unsupported(prober: Any, role: str, why: str) -> str:
    """``why`` (the probe's words for a role it cannot append, ``"end"`` for the engine's own turn) followed by the
    cause and the fix where one of the known causes explains it; ``why`` unchanged otherwise. ``prober`` is the
    probe at work (its renders, its head conversation, its tool-call shape)."""
    cause = _foreign_marker_cause(prober, role)
    if cause is None and role == "tool":
        cause = _single_call_close_cause(prober) or _no_tool_turn_cause(why)
    return f"{why}. Cause: {cause}" if cause else why


def _no_tool_turn_cause(why: str) -> str | None:
    """A template that raises its own error for a tool message (Gemma 2's "roles must alternate"): it has no tool
    turn, and no repair can make one."""
    if "chat template failed to render roles" not in why:
        return None
    return (
        "the template has no tool turn: it refuses a tool message with its own error. Fix: give the rollout a "
        "template that renders tool results (--chat-template FILE here; in training "
        "actor_rollout_ref.model.custom_chat_template), or train this model without tools"
    )


def _foreign_marker_cause(prober: Any, role: str) -> str | None:
    try:
        text, _ = prober.render(prober.ending_conversation(role), gen=role != "end")
    except TemplateError:
        return None
    foreign = foreign_markers(prober.r, text)
    if not foreign:
        return None
    named = ", ".join(repr(m) for m in foreign[:_SHOWN])
    more = f" and {len(foreign) - _SHOWN} more" if len(foreign) > _SHOWN else ""
    return (
        f"the template's markers {named}{more} are not tokens of this tokenizer (each encodes as several pieces of "
        "text), so no token can end a turn: the template and the tokenizer come from different models. Fix: audit "
        "the template with the tokenizer folder of its own model, or this tokenizer with its own template (without "
        "--chat-template); a folder whose files mix two models needs both copied again from one model's repository"
    )


def _single_call_close_cause(prober: Any) -> str | None:
    try:
        one, _ = prober.render(prober.ending_conversation("tool", calls=1), gen=True)
        two, _ = prober.render(prober.ending_conversation("tool", calls=2), gen=True)
    except TemplateError:
        return None
    after_one = _between(one, "QXARG1", "QXTOOL1")
    after_two = _between(two, "QXARG2", "QXTOOL1")
    if after_one is None or after_two is None:
        return None
    missing = _inserted(prober.r.encode(after_one), prober.r.encode(after_two))
    if not any(i in prober.r.special_ids for i in missing):
        return None
    close = prober.r.decode(missing)
    return (
        f"after a turn with one tool call the template writes no close, but after two calls it writes {close!r}: "
        "the close sits in the branch for the second and later calls (a bug in the template). Fix: write "
        f"{close!r} after every tool-call turn (after the loop over the calls), and pass the fixed template with "
        "--chat-template FILE (or save it as the folder's chat_template.jinja)"
    )


def _between(text: str, start: str, end: str) -> str | None:
    """The text after the last ``start`` and before the first ``end`` that follows it; None when either is absent."""
    at = text.rfind(start)
    stop = text.find(end, at) if at >= 0 else -1
    return text[at + len(start) : stop] if stop >= 0 else None


def _inserted(short: Sequence[int], long: Sequence[int]) -> list[int]:
    """The ids ``long`` holds between its common prefix and common suffix with ``short``."""
    prefix = 0
    while prefix < min(len(short), len(long)) and short[prefix] == long[prefix]:
        prefix += 1
    suffix = 0
    while suffix < min(len(short), len(long)) - prefix and short[-1 - suffix] == long[-1 - suffix]:
        suffix += 1
    return list(long[prefix : len(long) - suffix])
