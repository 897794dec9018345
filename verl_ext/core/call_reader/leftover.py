"""Call-like text a reading left outside its calls, by the template's own learned form (never a per-model list).

Two readings of one turn (verl's parser, the reader derived from the template) may disagree: a parser that cuts a
call at a marker inside a JSON string (``"</tool_call>"`` in an argument) reads fewer calls and leaves the rest of
the call in the content. Such a leftover is text of the form's own making outside any call: a control marker the
form writes around calls (its opener, lead, trail, closer, the Python call tag: ``<tool_call>``, ``[TOOL_CALLS]``,
``<|tool_call_end|>``), or, in a JSON-object form, an object holding the form's name and arguments keys. A marker
inside a JSON string of the leftover text is text, not a call's edge, and is not counted.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from verl_ext.core.call_reader.form import ID_SLOT, JSON_CALL, CallForm
from verl_ext.core.call_reader.literals import COUNTER, MARKER
from verl_ext.core.call_reader.read import arguments_key_of

_DECODER = json.JSONDecoder()


def call_markers(form: CallForm) -> tuple[str, ...]:
    """The control markers the form writes around its calls (chunks that are markers, counters and id slots aside)."""
    chunks = (*form.opener, *form.lead, *form.trail, *form.sep, *form.closer, *form.python_lead)
    return tuple(dict.fromkeys(c for c in chunks if MARKER.fullmatch(c) and COUNTER not in c and ID_SLOT not in c))


def call_text_left(form: CallForm, text: str) -> str | None:
    """The first call-like text in ``text`` (a reading's content) outside JSON strings: a marker of
    ``call_markers``, or (JSON-object forms) a JSON object with the form's name and arguments keys; None if none."""
    markers = call_markers(form)
    pattern = re.compile("|".join(map(re.escape, sorted(markers, key=len, reverse=True)))) if markers else None
    at = 0
    while at < len(text):
        brace = text.find("{", at)
        stop = brace if brace != -1 else len(text)
        m = pattern.search(text, at, stop) if pattern is not None else None
        if m is not None:
            return m.group()
        if brace == -1:
            return None
        try:
            value, end = _DECODER.raw_decode(text, brace)
        except json.JSONDecodeError:
            at = brace + 1  # not JSON here: the brace is text, the search goes on after it
            continue
        if form.encoding == JSON_CALL and arguments_key_of(form, value) is not None:
            return text[brace:end]
        at = end  # a JSON value: markers inside its strings are text
    return None


def outside(text: str, spans: Sequence[tuple[int, int]]) -> str:
    """``text`` without the ``[start, end)`` ``spans`` (in order, not overlapping)."""
    out, at = [], 0
    for a, b in sorted(spans):
        out.append(text[at:a])
        at = max(at, b)
    return "".join([*out, text[at:]])


def form_text_left(form: CallForm, content: str, wrapped: str = "", markers: Sequence[str] = ()) -> str:
    """The call-marker text a reading left in ``content`` (read back from a render whose content was ``wrapped``;
    the audit's read-back proof): the first of the form's own call chunks (the section's opener and close, a call's
    lead, trail and the text between calls, between a name and its arguments, the Python lead) or of the template's
    call ``markers`` (those it writes from a call's name on, a close the form did not learn included) found in it
    outside ``wrapped``; "" where there is none, or ``wrapped`` itself where the reading lost it. Stricter than
    ``call_text_left`` (any chunk, markers or not): a probe render's content holds no JSON and no call text."""
    if wrapped and wrapped not in content:
        return wrapped
    rest = content.replace(wrapped, "") if wrapped else content
    own = (*form.opener, *form.lead, *form.trail, *form.sep, *form.closer, *form.mid, *form.python_lead, *markers)
    return next((c for c in own if c not in (ID_SLOT, COUNTER) and COUNTER not in c and c in rest), "")
