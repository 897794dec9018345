"""Keyed parameter values (``<parameter=K>\\nVALUE\\n</parameter>``) read where the template really closes them.

A keyed value is raw text: nothing in it is escaped, so a value may hold the close's own marker (an agent editing
code about tool calls writes ``"see </parameter> here"``, or ``</function>``, ``</tool_call>``). After a close the
form goes on (the next parameter's key, the call's trail, or the turn's end), so a value ends at the first close the
form goes on after: a marker the form does not go on after is the value's text. A close the form does go on after
is one whatever whitespace is around it: a model may drop the template's newline before ``</parameter>``
(``"1+2</parameter>"``), and that text cannot be told by its whitespace from a string holding
``"</parameter><parameter=b>"`` (verl's qwen3_coder parser reads it as a close too).

Text inside a call that is no parameter is never dropped. Between two parameters it is, by the rule above, the
preceding value's text (``<parameter=a>\\n1\\n</parameter>\\nXYZ\\n<parameter=b>...``: the close after ``1`` is
followed by ``XYZ``, so ``a`` runs on to the next close the form goes on after). Before the first parameter, or
after a value none of whose closes the form goes on after (``...\\n3\\n</parameter>\\nXYZ\\n</function>``: stray
text after the last parameter), the call is not the form's (``call_goes_on`` is false): the derived reader does not
read it, counts it malformed and keeps its text in the content. verl's qwen3_coder parser reads the parameters it
finds and drops the text between them (``a`` 1, ``b`` 2, no ``XYZ``); no cut of the text gives that reading (below),
so it is judged ``NOT_WRITTEN`` and the derived reading, which keeps the text, is taken. A call that writes one key
twice is not read either (verl's parser keeps the last value and drops the first; no cut gives a key twice). A
value no close follows at all (a turn cut short inside it) is left out of the reading, its text in the content.

``keyed_writes`` is the fact ``faults.NOT_WRITTEN`` judges a reading's keyed call by: some way of cutting the text
after the call's name into parameters (at any of the closes the form goes on after) gives exactly its arguments, a
string with the template's own whitespace around it (``CallForm.value_open``, ``value_close``: where two readings
differ, a string value is the template's text between them).
verl's qwen3_coder parser ends a value at the first ``</function>`` or ``</tool_call>`` even inside it, and reads
``"see "``: no cut of the text gives that, so that reading is not what the text writes. Where two cuts give two
different calls (a value holding the template's own text between two parameters, context and all), both are
written: the render is ambiguous, and the readings are judged by their other faults.

``keyed_writes`` decides without enumerating the cuts (up to 2 to the number of closes the form goes on after: a
cap on them judged a value with more such closes not written). It follows the arguments, a parameter a step: a
string's text ends at the one close after the template's text of it, found without a scan; another value's at the
closes whose text reads as it, none before the length of its own strings, and none past as many closes as its
strings hold markers unless a comment (``#``) opens before (the text up to a close holds the closes before it, and
JSON or a Python literal holds a close's marker only in a string, where the value holds it too, or in a comment).
Each state (where the cut is, the arguments left) is looked at once, and the answer is exact, never cut off:
linear in the closes for strings and for values whose strings hold no close marker; for a value whose strings hold
some, each close tried costs a parse of the text up to it.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator, Mapping
from typing import Any

from verl_ext.core.call_reader.form import CallForm
from verl_ext.core.call_reader.literals import chunk_pattern


def _joined(chunks: tuple[str, ...]) -> str:
    return r"\s*".join(chunk_pattern(c) for c in chunks)


class KeyedValues:
    """The patterns of one keyed form's parameters (compiled once per reader)."""

    def __init__(self, form: CallForm) -> None:
        self.form = form
        pre = "".join(rf"(?:\s*{chunk_pattern(c)})?" for c in form.key_pre[:-1])
        last = chunk_pattern(form.key_pre[-1]) if form.key_pre else ""
        kv = r"\s*".join(["", *map(chunk_pattern, form.key_value)])
        # a parameter's head: its key between the template's chunks, up to the whitespace before its value
        self.head = re.compile(pre + r"\s*" + last + r"\s*(?P<key>[^\s<>=/\"']+)" + kv)
        # a value's close, with any whitespace before it (the match starts at the first of that whitespace)
        self.close = re.compile(r"\s*" + _joined(form.value_post)) if form.value_post else None
        self.marker = re.compile(_joined(form.value_post)) if form.value_post else None  # the close without its space
        ends = [_joined(c) for c in (form.trail, form.closer) if c]
        # after a close the form goes on: another parameter, the call's trail (or the section's close), the end
        self.goes_on = re.compile(r"\s*(?:" + "|".join([self.head.pattern, *ends, r"\Z"]) + ")")
        close = form.value_close
        marker = re.search(r"\S", close)
        self.before = close[: marker.start()] if marker else ""  # the whitespace the template writes before the close

    def _closes(self, text: str, start: int) -> Iterator[re.Match[str]]:
        return self.close.finditer(text, start) if self.close is not None else iter(())

    def value_end(self, text: str, start: int) -> tuple[int, int] | None:
        """Where the value starting at ``start`` ends and where its close ends (see the module's doc): at the first
        close the form goes on after, else at the first close (the call is then not the form's: ``call_goes_on``
        is false after it); None where no close follows."""
        first = None
        for m in self._closes(text, start):
            if self.goes_on.match(text, m.end()) is not None:
                return m.start(), m.end()
            first = first or m
        return (first.start(), first.end()) if first is not None else None

    def call_goes_on(self, text: str, at: int) -> bool:
        """Whether the form goes on at ``at`` (after a call's name, or after its last parameter read): another
        parameter, the call's trail, the section's close, or the turn's end; stray text there is no call's."""
        return self.goes_on.match(text, at) is not None

    def read(self, text: str, at: int) -> Iterator[tuple[str, str, int]]:
        """The parameters from ``at`` on: (key, raw value with its whitespace stripped, where its close ends)."""
        while (h := self.head.match(text, at)) is not None:
            end = self.value_end(text, h.end())
            if end is None:
                return
            yield h.group("key"), text[h.end() : end[0]].strip(), end[1]
            at = end[1]

    def written(self, raw: str | None, value: Any) -> bool:
        """Whether ``raw`` (a value's text from its key's chunks to its close's marker) is the text of ``value``: a
        string as the template writes it (its own whitespace, the template's before and after it); another value
        as it reads (``reads_as``: its spacing is the model's); a value cut short (None) as any."""
        if raw is None:
            return True
        if isinstance(value, str):
            return raw == self.form.value_open + value + self.before
        return reads_as(raw, value, self.form.literals)

    def value_ends(self, text: str, start: int, value: Any) -> Iterator[int]:
        """Where the closes end whose value text from ``start`` is ``value`` as written (``written``), each a close
        the form goes on after (see the module's doc); a string's is found without a scan."""
        if isinstance(value, str):
            at = start + len(self.form.value_open + value + self.before)
            m = self.marker.match(text, at) if self.marker is not None else None
            if m is not None and self.written(text[start:at], value) and self.call_goes_on(text, m.end()):
                yield m.end()
            return
        chunk = self.form.value_post[0] if self.form.value_post else ""
        held = sum(t.count(chunk) for t in _strings(value)) if chunk else 0
        any_count = not chunk or chunk[0].isalnum() or any(c in chunk for c in "\\\"'#")
        any_count = any_count or any(chunk in t for t in self.form.literals)  # no bound on the closes to try
        comment = text.find("#", start)
        floor = start + _text_floor(value)  # a close inside the value's strings is passed without a parse
        for i, m in enumerate(self._closes(text, start)):
            at = _marker(m)
            # the text up to the i-th close (from 0) holds i close markers, which JSON or a Python literal holds only
            # in its strings (each one there in the value too: no escape starts with a marker) or in a comment
            if i > held and not any_count and not 0 <= comment < at:
                continue
            if at >= floor and self.call_goes_on(text, m.end()) and self.written(text[start:at], value):
                yield m.end()

    def writes(self, text: str, at: int, arguments: Mapping[str, Any]) -> bool:
        """Whether some cut of the text from ``at`` (after a call's name) into parameters, each closed at a close the
        form goes on after, gives exactly ``arguments`` (raw values as ``written``); a value no close follows (a
        turn cut short) is there with any value, or left out (the derived reader's reading of it). Searched along
        the arguments (``value_ends``), each state once: no enumeration of the cuts, no cap."""
        if not self.call_goes_on(text, at):
            return False
        stack, seen = [(at, frozenset(arguments))], set()
        while stack:
            state = stack.pop()
            if state in seen:
                continue
            seen.add(state)
            at, left = state
            h = self.head.match(text, at)
            if h is None:
                if not left:
                    return True
                continue
            key = h.group("key")
            if next(self._closes(text, h.end()), None) is None:  # cut short: the value whole (any value) or left out
                if not left or left == {key}:
                    return True
                continue
            if key in left:
                stack.extend((end, left - {key}) for end in self.value_ends(text, h.end(), arguments[key]))
        return False


def keyed_writes(values: KeyedValues, text: str, after_name: int, arguments: Mapping[str, Any]) -> bool:
    """Whether some cut of ``text`` after a call's name (``after_name``: where its parameters start) into parameters
    gives exactly ``arguments`` (each value written as the template writes it, ``KeyedValues.written``)."""
    return values.writes(text, after_name, arguments)


def reads_as(raw: str, value: Any, literals: Mapping[str, Any]) -> bool:
    """Whether a keyed value's raw text reads as ``value``: as it is, without the template's newline on each side
    (verl's qwen3_coder reading) or without any whitespace around it (the derived reader's); as text, as the
    template's literal, as JSON, or as a Python literal (templates that write values with ``|string``)."""
    one = raw[1:] if raw.startswith("\n") else raw
    one = one[:-1] if one.endswith("\n") else one
    want = _canonical(value)
    for text in dict.fromkeys((raw, one, raw.strip())):
        if isinstance(value, str):
            if text == value:
                return True
            continue
        if isinstance(value, bool) and text.lower() in ("true", "false") and (text.lower() == "true") is value:
            return True
        if value is None and text.lower() in ("null", "none"):
            return True
        for parse in (lambda t: literals[t], json.loads, ast.literal_eval):
            try:
                if _canonical(parse(text)) == want:
                    return True
            except (KeyError, ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
    return False


def _marker(m: re.Match[str]) -> int:
    """Where a close's marker starts (after the whitespace its match starts with)."""
    return m.start() + len(m.group()) - len(m.group().lstrip())


def _strings(value: Any) -> list[str]:
    """The strings in a JSON value (its keys and its values), depth first."""
    out, todo = [], [value]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            out.append(v)
        elif isinstance(v, Mapping):
            todo += [*v.keys(), *v.values()]
        elif isinstance(v, list | tuple):
            todo += v
    return out


def _text_floor(value: Any) -> int:
    """The fewest characters a JSON or Python literal text of ``value`` takes: each string in it (a key or a value)
    at least its own, one source character or more for each of its characters."""
    return sum(map(len, _strings(value)))


def _canonical(value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)
