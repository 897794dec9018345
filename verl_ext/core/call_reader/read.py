"""A model's turn read back into tool calls with a learned ``CallForm``.

Beyond the template's exact rendering, what a model plausibly writes is read too: any spacing between the form's
chunks, JSON with any key order or spacing, chunks of the form's header before the lead's anchor missing or moved
ahead of it (harmony's recipient in the header or in the channel), extra header words between a name and the
arguments' anchor (harmony's ``<|constrain|>json`` present or not), a call id the model chose, and a turn cut before
its trail or closer. A section whose anchor is there but whose call cannot be read is counted ``malformed`` and its
text stays in the content (the message must still describe the sampled text). Where the template calls built-in
tools in Python (``python_lead``: ``<|python_tag|>NAME.call(k="v")``), each such call is read too
(``python_call``), or, after the tag, a call in the form's JSON encoding; anything else after the tag is malformed.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from verl_ext.core.call_reader.form import (
    ID_SLOT,
    JSON_CALL,
    NAME_JSON,
    NAME_KEYED,
    CallForm,
    Chunks,
    ReadCall,
    ReadTurn,
)
from verl_ext.core.call_reader.keyed import KeyedValues, keyed_writes
from verl_ext.core.call_reader.literals import MARKER, chunk_pattern
from verl_ext.core.call_reader.python_call import read_python_call

_NAME = r"(?P<name>[A-Za-z_][\w\-]*(?:\.[\w\-]+)*)(?![\w\-])"
_ID = r"(?P<id>[A-Za-z0-9_\-]+)"
# Header words a model may add between a name and the arguments' anchor: control markers, or words after a space
# or a marker (never glued to the name).
_NOISE = r"(?:\s*<\|[^<>|\s]+\|>|\s+[A-Za-z_][\w\-]*|(?<=\|>)[A-Za-z_][\w\-]*)"
_DECODER = json.JSONDecoder()
_SPACE = re.compile(r"\s*")


def _chunk(c: str) -> str:
    return _ID if c == ID_SLOT else chunk_pattern(c)


def _optional(chunks: Chunks) -> str:
    return "".join(rf"(?:\s*{_chunk(c)})?" for c in chunks) + r"\s*"


def _distinctive(chunk: str) -> bool:
    return len(chunk) >= 3 or bool(MARKER.fullmatch(chunk))


def anchored(chunks: Chunks) -> str | None:
    """A regex for a header: chunks before its last distinctive one optional (a model may drop or move them),
    from that one on required; None for a header with no distinctive chunk (nothing to find a call by)."""
    last = max((i for i, c in enumerate(chunks) if _distinctive(c)), default=None)
    if last is None:
        return None
    required = r"\s*".join(_chunk(c) for c in chunks[last:])
    return _optional(chunks[:last]) + required + r"\s*"


def _mid(chunks: Chunks) -> str:
    """Between a name and its arguments: the last chunk required, the others optional, header noise allowed."""
    if not chunks:
        return r"\s*"
    parts = [rf"(?:{_NOISE}|\s*{_chunk(c)})*?" for c in chunks[:-1]]
    return "".join(parts) + rf"(?:{_NOISE})*?\s*{_chunk(chunks[-1])}\s*"


class CallReader:
    """Reads turns in one learned ``CallForm`` (patterns compiled once)."""

    def __init__(self, form: CallForm) -> None:
        self.form = form
        lead = anchored(form.lead)
        self.anchorless = lead is None  # no anchor of each call: a next call that cannot be read has no section
        if lead is not None:  # each call has an anchor of its own (<tool_call>, to=functions., >>>)
            section: str | None = _optional(form.opener) + f"(?P<lead>{lead})"
        else:  # the section's opener anchors the first call (Mistral's [TOOL_CALLS] [), or nothing does (Llama)
            section = anchored((*form.opener, *form.lead))
            section = f"(?P<lead>{section})" if section is not None else None
            lead = _optional(form.lead)
        self.section = re.compile(section) if section is not None else None
        # (?P<lead>...): where the next call's own text starts (its span, ``ReadTurn.spans``)
        self.next_call = re.compile(_optional(form.trail) + _optional(form.sep) + f"(?P<lead>{lead})")
        self.call_trail = re.compile(_optional(form.trail))
        closing = "|".join(_chunk(c) for c in (*form.trail, *form.closer) if _distinctive(c))
        # a section no call is read from ends at its trail or closer, outside JSON strings in the JSON encodings
        strings = r'"(?:[^"\\\n]|\\.)*"|' if form.encoding in (JSON_CALL, NAME_JSON) else ""
        self.closing = re.compile(f"{strings}(?P<close>{closing})") if closing else None
        # a keyed value is raw text, so one chunk of the trail may be a value's ("see </function> here"): an unread
        # keyed section ends at the whole trail where one follows, else at its first trail or closer chunk
        whole = r"\s*".join(_chunk(c) for c in form.trail)
        keyed = form.encoding == NAME_KEYED and len(form.trail) > 1
        self.whole_trail = re.compile(f"(?P<close>{whole})") if keyed else None
        self.trail = re.compile(_optional(form.trail) + _optional(form.closer))
        self.name_mid = re.compile(r"\s*" + _NAME + _mid(form.mid))
        self.values = KeyedValues(form)  # NAME_KEYED: parameters cut where the template closes them
        # distinctive ones only: a short chunk (Seed-OSS's '>' after a name) would take the '>' of a tag before the
        # call ('</seed:think>') from the content
        self.header_chunks = frozenset(c for c in (*form.opener, *form.lead, *form.mid) if _distinctive(c)) - {ID_SLOT}
        python = anchored(form.python_lead) if form.python_lead else None
        self.python = re.compile(python) if python is not None else None
        wrap = form.content_wrap
        self.unwrap = (
            re.compile(
                r"\s*".join(["", *map(_chunk, wrap[0])])
                + (f"(?:{re.escape(form.content_pad)})?" if form.content_pad else "")
                + r"(?P<c>.*?)"
                + r"\s*".join(["", *map(_chunk, wrap[1]), ""]),
                re.DOTALL,
            )
            if wrap
            else None
        )

    def writes(self, text: str, name: str, arguments: Any = None) -> bool:
        """Whether ``text`` (a turn as ``read`` takes it) holds a call of ``name`` with ``arguments`` (a JSON object;
        None: any) where the form writes one: in the JSON encodings a call object (or the name after the form's lead,
        then the object after its mid) equal to it by value; in the keyed encoding the name after the lead, then
        parameters that some cut of the text at the template's closes gives as ``arguments`` (``keyed_writes``: the
        values are the template's text, not JSON); a call in Python after the form's Python lead by its name."""
        full = self.form.generation_prompt + text
        want = None if arguments is None else _canonical(arguments)
        if self.form.encoding == JSON_CALL:
            at = full.find("{")
            while at >= 0:
                obj, _ = _json_at(full, at)
                call = _json_call(self.form, obj)
                if call is not None and call.name == name and want in (None, _canonical(json.loads(call.arguments))):
                    return True
                at = full.find("{", at + 1)
        else:
            lead = anchored(self.form.lead) or _optional(self.form.lead)
            named = re.compile(f"(?:{lead})" + re.escape(name) + r"(?![\w\-])" + _mid(self.form.mid))
            for m in named.finditer(full):
                if self.form.encoding == NAME_KEYED and isinstance(arguments, Mapping):
                    if keyed_writes(self.values, full, m.end(), arguments):
                        return True
                elif self.form.encoding != NAME_JSON or want in (None, _canonical(_json_at(full, m.end())[0])):
                    return True
        return self.python is not None and re.search(rf"(?<![\w.]){re.escape(name)}\.call\(", text) is not None

    def read(self, text: str, types: Mapping[str, Mapping[str, str]] | None = None) -> ReadTurn:
        """Read a turn's text (as sampled, without the generation prompt; ``types``: parameter types per tool, used
        to keep a string parameter a string in the keyed encoding)."""
        m = self.python.search(text) if self.python is not None else None
        if m is None:
            return self._read(text, types)
        before = self._read(text[: m.start()], types)  # what precedes the first tag, in the form's own encoding
        content, calls, malformed = [before.content], list(before.calls), before.malformed
        spans, unread = list(before.spans), list(before.unread)
        while m is not None:
            call, end = read_python_call(text, m.end())
            if call is None and self.form.encoding == JSON_CALL:  # <|python_tag|>{"name": ..., "parameters": ...}
                obj, end = _json_at(text, m.end())
                call = _json_call(self.form, obj)
            nxt = self.python.search(text, end if call is not None else m.end())
            stop = nxt.start() if nxt is not None else len(text)
            if call is None:
                malformed += 1
                content.append(text[m.start() : stop])  # kept as sampled: the message describes the text
                unread.append((m.start(), stop, False))
            else:
                calls.append(call)
                spans.append((m.start(), end))
                content.append(text[end:stop])
            m = nxt
        return ReadTurn("".join(content), tuple(calls), malformed, tuple(spans), tuple(unread))

    def _read(self, text: str, types: Mapping[str, Mapping[str, str]] | None) -> ReadTurn:
        """``read`` in the form's own encoding."""
        full = self.form.generation_prompt + text
        start = len(self.form.generation_prompt)
        at = start
        content: list[str] = []
        calls: list[ReadCall] = []
        spans: list[tuple[int, int]] = []
        unread: list[tuple[int, int, bool]] = []
        malformed = 0
        in_prompt = True  # the first anchor may sit in the generation prompt
        while True:
            found = self._find_section(full, at, start, in_prompt)
            if found is None:
                content.append(full[at:])
                break
            head, lead_at, body_at = found
            in_prompt = False
            read, end, where, attempted = self._read_calls(full, body_at, types or {}, lead_at)
            malformed += attempted
            if not read and body_at <= start:  # an anchor the generation prompt wrote, with no call after it
                malformed += self._attempted(full, body_at)  # or an anchorless call that cannot be read (Llama)
                continue
            if not read:
                malformed += 1
                section = self._unread(full, max(head, start), body_at, start)
                unread.append(section)
                # a closed section is read past as a whole (an anchor inside its strings is text), else from its body
                stop = section[1] + start if section[2] else body_at
                content.append(full[at:stop])
                at = stop
                continue
            content.append(full[at : max(at, head)])
            calls += read
            spans += [(max(a, start) - start, b - start) for a, b in where]
            at = end
        turn = ReadTurn(self._content("".join(content)), tuple(calls), malformed, tuple(spans), tuple(unread))
        return turn

    def _unread(self, text: str, head: int, body_at: int, start: int) -> tuple[int, int, bool]:
        """An opened section no call was read from: from its head to the form's first trail or closer chunk
        (closed), else to the next section or the end; in the coordinates of the text read."""
        nxt = self._find_section(text, body_at, start, False)
        limit = nxt[0] if nxt is not None and nxt[0] >= body_at else len(text)
        m = self.whole_trail.search(text, body_at, limit) if self.whole_trail is not None else None
        found = self.closing.finditer(text, body_at, limit) if self.closing is not None and m is None else iter(())
        m = m or next((x for x in found if x.group("close") is not None), None)
        return head - start, (m.end() if m else limit) - start, m is not None

    def _find_section(self, text: str, at: int, start: int, in_prompt: bool) -> tuple[int, int, int] | None:
        """Where the next call section starts (with the form's own chunks right before it), where its first call's
        lead starts, and where that call itself starts; None when there is none."""
        if self.section is None:  # no anchor: calls sit right at the turn's start, as the template renders them
            if not in_prompt:
                return None
            m = _SPACE.match(text, at)
            return (at, m.end(), m.end()) if m and m.end() < len(text) and text[m.end()] in "{[" else None
        # the first section may start inside the generation prompt (Llama's header, functionary's ">>>"), never
        # end there
        m = self.section.search(text, 0 if in_prompt else at)
        while m is not None and m.end() < start:
            m = self.section.search(text, m.start() + 1)
        if m is None:
            return None
        head = m.start()
        while True:  # the form's header chunks right before the anchor belong to the call (harmony's channel)
            before = text[at:head].rstrip()
            moved = next((c for c in self.header_chunks if c and before.endswith(c)), None)
            if moved is None:
                break
            head = at + len(before) - len(moved)
        lead_at = head if head < m.start() else _after_space(text, m.start("lead"))
        return head, lead_at, m.end()

    def _read_calls(
        self, text: str, at: int, types: Mapping[str, Mapping[str, str]], lead_at: int
    ) -> tuple[list[ReadCall], int, list[tuple[int, int]], int]:
        """Calls from ``at`` (just after a section's first lead, which starts at ``lead_at``) on, where the section
        ends, each call's span (from its lead to its trail), and whether a call object after the last readable one
        could not be read (1: malformed; its text stays in the content)."""
        calls: list[ReadCall] = []
        spans: list[tuple[int, int]] = []
        last = at
        while True:
            call, end = self._read_one(text, at, len(calls), types)
            if call is None:
                break
            calls.append(call)
            trail = self.call_trail.match(text, end)
            spans.append((lead_at, max(end, len(text[: trail.end()].rstrip())) if trail else end))
            last = end
            m = self.next_call.match(text, end)
            if m is None:
                break
            at, lead_at = m.end(), _after_space(text, m.start("lead"))
        if not calls:
            return calls, at, spans, 0
        m = self.trail.match(text, last)
        # a form without an anchor of each call (Mistral's [{...}, {...}], firefunction's functools[...]) finds no
        # next section where a call cannot be read: it is counted here, or it would pass for content
        unread = int(self.anchorless and at != last and self._attempted(text, at))
        return calls, m.end() if m else last, spans, unread

    def _attempted(self, text: str, at: int) -> int:
        """1 where a JSON call object (one holding the form's name key) starts at ``at`` whose call cannot be read
        (arguments that are no JSON object, or under no known key), else 0."""
        if self.form.encoding != JSON_CALL:
            return 0
        obj, _ = _json_at(text, at)
        return int(
            isinstance(obj, dict) and isinstance(obj.get(self.form.name_key), str) and not _json_call(self.form, obj)
        )

    def _read_one(
        self, text: str, at: int, index: int, types: Mapping[str, Mapping[str, str]]
    ) -> tuple[ReadCall | None, int]:
        form = self.form
        if form.encoding == JSON_CALL:
            obj, end = _json_at(text, at)
            return _json_call(form, obj), end
        m = self.name_mid.match(text, at)
        if m is None:
            return None, at
        name, call_id = m.group("name"), m.groupdict().get("id")
        if form.encoding == NAME_JSON:
            obj, end = _json_at(text, m.end())
            if not isinstance(obj, dict):
                return None, at
            return ReadCall(name, text[m.end() : end].strip(), call_id), end
        args: dict[str, Any] = {}
        end = m.end()
        declared = types.get(name) or {}
        for key, raw, stop in self.values.read(text, end):
            if key in args:  # a key written twice: one reading would drop a value the model wrote (keyed's doc)
                return None, at
            args[key] = self._value(raw, declared.get(key))
            end = stop
        if not self.values.call_goes_on(text, end):  # text in the call that is no parameter: not the form's call
            return None, at
        return ReadCall(name, json.dumps(args, ensure_ascii=False), call_id), end

    def _value(self, raw: str, declared: str | None) -> Any:
        """A keyed parameter's value: the text for a declared string; else the template's own literal for true,
        false or null, JSON, a Python literal (templates that write values with ``|string``), or the text."""
        if declared == "string":
            return raw
        if raw in self.form.literals:
            return self.form.literals[raw]
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            pass
        if raw[:1] in "[{(":
            try:
                value = ast.literal_eval(raw)
                return value if isinstance(value, dict | list) else raw
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return raw
        return raw

    def _content(self, text: str) -> str:
        if self.unwrap is not None and (m := self.unwrap.fullmatch(text)) is not None:
            return m.group("c")
        return text


def _after_space(text: str, at: int) -> int:
    return _SPACE.match(text, at).end()  # type: ignore[union-attr]  # \s* always matches


def _canonical(value: Any) -> str:
    """A JSON value by meaning (keys sorted; ``true`` is not ``1``), to compare two readings' arguments."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def _json_at(text: str, at: int) -> tuple[Any, int]:
    """The JSON value starting at ``at`` after whitespace, and where it ends; (None, at) where none parses."""
    begin = _SPACE.match(text, at).end()  # type: ignore[union-attr]  # \s* always matches
    try:
        value, end = _DECODER.raw_decode(text, begin)
    except json.JSONDecodeError:
        return None, at
    return value, end


_OTHER_KEY = {"arguments": "parameters", "parameters": "arguments"}  # the other key models write


def arguments_key_of(form: CallForm, obj: Any) -> str | None:
    """The key a JSON_CALL object holds its arguments under: the form's ``arguments_key``, or the other common key a
    model may write (``arguments`` for ``parameters`` and back); None for an object that is no call (no name
    string under ``name_key``, or neither key)."""
    if not isinstance(obj, dict) or not isinstance(obj.get(form.name_key), str):
        return None
    key = form.arguments_key if form.arguments_key in obj else _OTHER_KEY.get(form.arguments_key)
    return key if key is not None and key in obj else None


def _json_call(form: CallForm, obj: Any) -> ReadCall | None:
    """A JSON_CALL object read: the name under ``name_key``, the arguments (an object, or JSON text of one) under
    ``arguments_key_of``."""
    key = arguments_key_of(form, obj)
    if key is None:
        return None
    args = obj[key]
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    call_id = obj.get(form.id_key) if form.id_key else None
    return ReadCall(
        obj[form.name_key], json.dumps(args, ensure_ascii=False), call_id if isinstance(call_id, str) else None
    )


def parameter_types(schemas: Sequence[Any]) -> dict[str, dict[str, str]]:
    """Parameter types per tool name from tool schemas (OpenAI dicts, or objects with ``model_dump``)."""
    out: dict[str, dict[str, str]] = {}
    for schema in schemas:
        data = schema.model_dump() if hasattr(schema, "model_dump") else schema
        function = data.get("function") if isinstance(data, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            continue
        props = (function.get("parameters") or {}).get("properties") or {}
        out[function["name"]] = {k: v.get("type") for k, v in props.items() if isinstance(v, Mapping)}
    return out
