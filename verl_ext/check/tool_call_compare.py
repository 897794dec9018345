"""Does a turn's message hold the tool calls the engine sampled? Calls compared by meaning, block by block.

A template re-serializes every call a parser read: its own whitespace around and inside the call, its own key
order and separators, numbers and strings as its JSON encoder (or Python's ``str``) writes them. A model writes the
same call its own way (``<tool_call> {"arguments":{"k":1e2},"name":"calc"}``). The two are the same call when the
name and every argument value the message holds were sampled, in the call the template writes in that place.

The comparison reads the text by the template's own call structure, never by model name: the control tokens the
template writes once per call, an opener and a closer around the call's name and arguments (``<tool_call>`` and
``</tool_call>``, ``<|tool_call_begin|>`` and ``<|tool_call_end|>``, ``<seed:tool_call>`` and ``</seed:tool_call>``),
cut both texts into call blocks. Message call ``k`` must be held by a sampled block after the block that holds call
``k - 1``:

- its name sampled there as a word (raw or JSON-escaped);
- each argument's value sampled after its key there, equal by value: numbers by value (``1e2`` == ``100.0``,
  ``2.50`` == ``2.5``), strings by their decoded text (``"caf\\u00e9"`` == ``café``), objects whatever their key
  order, booleans and null only as themselves; where a parameter's value is raw text (XML formats), the text with
  the template's newlines around it, or the JSON or number it reads as.

A sampled block no call lies in is a call the parser could not read (``malformed``: a JSON call without
``arguments``, broken JSON, an XML call without its function header), kept in the stream as sampled, or a call the
message dropped (``dropped``: it reads as a call). Two calls swapped leave the first block unmatched and readable:
dropped. Without such markers (a template whose calls carry no control token) nothing is read here: the turn's
verdict (``sampled_text``) compares the JSON objects as before.

The blocks come from the reading the loop uses: where a reader is derived from the template
(``verl_ext.core.call_reader``), each call it reads is a block, from its lead to its trail, and each section it
opened but could not read is one too (closed where the form's trail or closer follows); a marker inside a JSON
string is text there, as JSON decoding decides where a JSON call ends. Where none is derived, the markers cut the
text, a JSON object right after an opener read whole (its strings' markers are text).
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.check.sampled_text import json_and_text
from verl_ext.core.call_reader import CallReader
from verl_ext.core.call_reader.literals import MARKER

_WORD = re.compile(r"\w", re.UNICODE)
# What may stand between a key and its value: the key's closing quote, then ':' (JSON), '=' or '>' (XML forms).
_KEY_END = '"'
_KEY_SEPARATORS = ":=>"


@dataclass(frozen=True)
class Block:
    """One call block of a text: ``[start, end)`` in characters, whether its closer is there (``closed``), and the
    message call it holds (``call``; None when none)."""

    start: int
    end: int
    closed: bool
    call: int | None = None
    readable: bool = False
    read: tuple[str, Any] | None = None  # the call the reader read in it: its name and arguments

    @property
    def malformed(self) -> bool:
        """A complete block that holds no call the message has and reads as none: what a parser could not read."""
        return self.closed and self.call is None and not self.readable

    @property
    def dropped(self) -> bool:
        """A complete block that reads as a call the message does not hold."""
        return self.closed and self.call is None and self.readable


@dataclass(frozen=True)
class CallsReading:
    """The message's calls against the sampled text: ``holds`` (every call held in order, no call dropped), the
    first problem (``detail``), and each text's blocks."""

    holds: bool
    detail: str
    sampled: tuple[Block, ...]
    rendered: tuple[Block, ...]

    def malformed(self) -> tuple[Block, ...]:
        return tuple(b for b in self.sampled if b.malformed)


def read_calls(
    sampled: str,
    rendered: str,
    calls: Sequence[Mapping[str, Any]],
    markers: tuple[str, str] | None,
    reader: CallReader | None = None,
    types: Mapping[str, Mapping[str, str]] | None = None,
) -> CallsReading | None:
    """The message's ``calls`` (its ``tool_calls``) read against the turn's ``sampled`` and ``rendered`` texts, cut
    into blocks by ``reader`` (the reader derived from the template, as the loop reads the turn; ``types``: the tools'
    parameter types) or, without one, by ``markers`` (``call_markers``); None with neither, or where neither the
    message nor the sampled text holds a call block. A reader alone (no markers) is how a template that writes all of
    a turn's calls in one list (Mistral's ``[TOOL_CALLS] [...]``) is read: each call of the list a block, so the
    calls are compared in order and by count as there."""
    if markers is None and reader is None:
        return None
    opener, closer = markers or ("", "")
    wanted = [_call_parts(c) for c in calls]
    theirs = tuple(read_blocks(reader, rendered, types) if reader else _blocks(rendered, opener, closer))
    ours = list(read_blocks(reader, sampled, types) if reader else _blocks(sampled, opener, closer))
    if not ours or (not wanted and not any(b.closed for b in ours)):
        return None  # the model wrote no call in the template's format (hermes on a template of another): not read
    # the template's text before a call's name, from the first call it wrote (not from call text in the content)
    first = next((b for b in theirs if (b.read is not None if reader else b.closed)), None)
    prefix = _name_prefix(rendered[first.start : first.end], opener, wanted[0][0]) if first and wanted else ""
    detail = ""
    read = [b for b, block in enumerate(ours) if block.read is not None]
    by_reading = len(read) == len(wanted) and all(_read_holds(ours[b], *w) for b, w in zip(read, wanted, strict=True))
    if by_reading:  # the message holds the reader's reading, call by call (the loop took it): each call in its block
        ours = [_with(block, call=read.index(b)) if b in read else block for b, block in enumerate(ours)]
    if markers is None and not by_reading:
        held = [
            any(_holds(sampled[b.start : b.end], n, a, prefix) or _read_holds(b, n, a) for b in ours) for n, a in wanted
        ]
        if not all(held):
            # a call no block of the template's list holds: the loop read it in another format (verl's hermes parser
            # on a Mistral turn), or the message changed it; the text verdict reads the turn as it did before
            return None
    at = 0
    for k, (name, args) in enumerate(() if by_reading else wanted):
        # by its text first (the template's own keys), then by the call the reader read there (``parameters``)
        hit = next(
            (
                b
                for b in range(at, len(ours))
                if _holds(sampled[ours[b].start : ours[b].end], name, args, prefix) and _same_keys(ours[b], args)
            ),
            None,
        )
        if hit is None:
            hit = next((b for b in range(at, len(ours)) if _read_holds(ours[b], name, args)), None)
        if hit is None:
            shown = json.dumps({"name": name, "arguments": args}, ensure_ascii=False, sort_keys=True, default=str)
            detail = detail or f"the message holds tool call {k + 1} {shown[:160]} that the engine did not sample there"
            continue
        ours[hit] = _with(ours[hit], call=k)
        at = hit + 1
    ours = _unmatched_blocks(ours, theirs, wanted, sampled, prefix, alone=markers is None)
    dropped = next((b for b in ours if b.dropped), None)
    if dropped is not None and not detail:
        text = sampled[dropped.start : dropped.end]
        detail = f"the engine sampled a tool call the message does not hold in its place: {text[:160]!r}"
    return CallsReading(not detail, detail, tuple(ours), theirs)


def _unmatched_blocks(
    ours: list[Block],
    theirs: Sequence[Block],
    wanted: Sequence[tuple[str, Any]],
    sampled: str,
    prefix: str,
    *,
    alone: bool,
) -> list[Block]:
    """``ours`` with each closed block no message call matched marked readable (a dropped call) or not (call text the
    message keeps as text); ``alone``: the reader alone cut the calls (the template writes no per-call markers)."""
    # Where the reader alone cuts the calls, the calls it reads in the render beyond the message's are call text the
    # message holds as text (its content: a loop whose parser does not read the template's format keeps it there)
    as_text = Counter(_read_key(b.read) for b in theirs if b.read is not None) if alone else Counter()
    as_text.subtract(_read_key(w) for w in wanted)
    for b, block in enumerate(ours):
        if block.call is None and block.closed and block.read is not None and as_text[_read_key(block.read)] > 0:
            as_text[_read_key(block.read)] -= 1
            ours[b] = _with(block, readable=False)  # not a dropped call: the parser did not read it, the text is kept
            continue
        if block.call is None and block.closed:
            # where the reader alone cuts the calls (no per-call markers: no parser of the markers read them), a call
            # it read is a call (functionary's first call, after the ">>>" its generation prompt holds, shows no text
            # before its name to read it by); with markers, the reader also reads calls the loop's parser cannot
            # (``parameters`` for ``arguments``): those read by the text
            read = alone and block.read is not None
            readable = read or _readable(sampled[block.start : block.end], prefix, bool(wanted))
            ours[b] = _with(block, readable=readable)
    return ours


def _read_key(call: tuple[str, Any]) -> str:
    """A call (name, arguments) as one comparable text."""
    return json.dumps(call, sort_keys=True, ensure_ascii=False, default=str)


def call_markers(
    text: str, names: Sequence[str], structure: re.Pattern[str] | None, keys: Sequence[str] = ()
) -> tuple[str, str] | None:
    """The control texts a template writes once per call in ``text`` (its rendering of a message calling ``names``,
    in order, the first with arguments named ``keys``): an opener, and the last closer after it before the next
    call, with the first call's name and argument keys between them; None where there are none. A closer the
    template writes before the arguments (Mistral Small 3.2's ``[ARGS]``, no control text after them) would cut
    each call off its arguments: no markers then."""
    if structure is None or not names:
        return None
    found = [(m.start(), m.group()) for m in structure.finditer(text)]
    counts = Counter(t for _, t in found)
    once = [t for t in dict.fromkeys(t for _, t in found) if counts[t] == len(names)]
    for opener in once:
        a = text.find(opener)
        nxt = text.find(opener, a + len(opener))
        limit = nxt if nxt != -1 else len(text)
        ends = [(text.find(c, a + len(opener)), c) for c in once if c != opener]
        ends = [
            (b, c) for b, c in ends if b != -1 and b < limit and all(_word_at(text[a:b], w) for w in (names[0], *keys))
        ]
        if ends:
            return opener, max(ends)[1]
    return None


def without_blocks(text: str, blocks: Sequence[Block]) -> str:
    """``text`` with every complete block (and every block a call lies in) cut out, as a parser takes them out."""
    out, at = [], 0
    for b in blocks:
        if b.closed or b.call is not None:
            out.append(text[at : b.start])
            at = b.end
    return "".join([*out, text[at:]])


_PYTHON_CALL_HEAD = re.compile(r"(?<![\w.])[A-Za-z_]\w*\.call\(")


def without_python_calls(sampled: str, rendered: str) -> tuple[str, str]:
    """Both texts without the calls written in Python (``NAME.call(k="v")``, Llama 3.1-3.3's built-in tools) that the
    render holds as sampled: each rendered call, in order, equal by name and value to a sampled one after the last
    (``q='x'`` is ``q="x"``; other spacing, a trailing comma). Where a rendered call is not sampled so, both texts
    are returned as they are, for the verdict to name it."""
    ours, theirs = _python_calls(sampled), _python_calls(rendered)
    if not theirs:
        return sampled, rendered
    at, kept = 0, []
    for name, args, _, _ in theirs:
        hit = next((k for k in range(at, len(ours)) if ours[k][0] == name and same_value(ours[k][1], args)), None)
        if hit is None:
            return sampled, rendered
        kept.append(ours[hit])
        at = hit + 1
    return _cut(sampled, [(a, b) for _, _, a, b in kept]), _cut(rendered, [(a, b) for _, _, a, b in theirs])


def _python_calls(text: str) -> list[tuple[str, Any, int, int]]:
    """Each call in Python form in ``text``: its name, arguments and [start, end) in characters."""
    from verl_ext.core.call_reader.python_call import read_python_call

    out: list[tuple[str, Any, int, int]] = []
    at = 0
    for m in _PYTHON_CALL_HEAD.finditer(text):
        if m.start() < at:
            continue
        call, end = read_python_call(text, m.start())
        if call is not None:
            out.append((call.name, _arguments(call.arguments), m.start(), end))
            at = end
    return out


def _cut(text: str, spans: Sequence[tuple[int, int]]) -> str:
    out, at = [], 0
    for a, b in spans:
        out.append(text[at:a])
        at = b
    return "".join([*out, text[at:]])


def same_value(a: Any, b: Any) -> bool:
    """Equal by meaning: numbers by value (booleans only as booleans), strings as text, objects key by key whatever
    their order, lists item by item."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b


def _call_parts(call: Mapping[str, Any]) -> tuple[str, Any]:
    """A message call's name and arguments (a JSON string read as its object)."""
    function = call.get("function") if isinstance(call.get("function"), Mapping) else call
    return str(function.get("name", "")), _arguments(function.get("arguments"))


def read_blocks(reader: CallReader, text: str, types: Mapping[str, Mapping[str, str]] | None = None) -> list[Block]:
    """The call blocks of ``text`` as ``reader`` reads it (``ReadTurn.spans`` and ``unread``), in order."""
    turn = reader.read(text, types)
    read = [(c.name, _arguments(c.arguments)) for c in turn.calls]
    blocks = [Block(a, b, True, read=r) for (a, b), r in zip(turn.spans, read, strict=True)]
    blocks = sorted(blocks + [Block(a, b, closed) for a, b, closed in turn.unread], key=lambda b: b.start)
    trail = [c for c in reader.form.trail if MARKER.fullmatch(c)]
    for k, block in enumerate(blocks):
        if block.read is not None and trail and not text[block.start : block.end].endswith(trail[-1]):
            # a call the reader read without its trail (cut by the stop): the rest of the text up to the next block
            # is the call's, unclosed, as the markers cut it
            end = blocks[k + 1].start if k + 1 < len(blocks) else len(text)
            blocks[k] = _with(block, end=end, closed=False)
    return blocks


def _read_holds(block: Block, name: str, args: Any) -> bool:
    """The call the reader read in the block is ``name`` with ``args``, by value."""
    return block.read is not None and block.read[0] == name and same_value(block.read[1], args)


def _same_keys(block: Block, args: Any) -> bool:
    """The message's call has every argument the reader read in the block (a parameter the message dropped is not
    held: ``_holds`` finds each argument the message has, never one it lacks); true where the reader read none."""
    read = block.read[1] if block.read is not None else None
    return not isinstance(read, Mapping) or not isinstance(args, Mapping) or read.keys() <= args.keys()


def _blocks(text: str, opener: str, closer: str) -> list[Block]:
    """The call blocks of ``text``: from each opener to the closer after it (closed), or to the next opener or the
    end (not closed). A JSON value right after the opener is read whole: a marker inside its strings is text."""
    out: list[Block] = []
    a = text.find(opener)
    while a != -1:
        body = _json_end(text, a + len(opener))
        nxt = text.find(opener, body)
        b = text.find(closer, body)
        if b != -1 and (nxt == -1 or b < nxt):
            out.append(Block(a, b + len(closer), True))
            a = text.find(opener, b + len(closer))
        else:
            out.append(Block(a, nxt if nxt != -1 else len(text), False))
            a = nxt
    return out


def _json_end(text: str, at: int) -> int:
    """Where a JSON value starting at ``at`` (after whitespace) ends; ``at`` where none does."""
    begin = len(text) - len(text[at:].lstrip())
    if text[begin : begin + 1] not in ("{", "["):
        return at
    try:
        return json.JSONDecoder().raw_decode(text, begin)[1]
    except json.JSONDecodeError:
        return at


def _with(block: Block, **changes: Any) -> Block:
    return Block(**{**block.__dict__, **changes})


def _forms(text: str) -> tuple[str, ...]:
    """``text`` as a model may write it: as is, and JSON-escaped with and without ``ensure_ascii``."""
    return tuple(dict.fromkeys((text, json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1])))


def _word_at(text: str, word: str) -> list[int]:
    """Where ``word`` (any of its forms) ends in ``text`` as a whole word (no word character on either side)."""
    ends = []
    for form in _forms(word):
        if not form:
            continue
        i = text.find(form)
        while i != -1:
            j = i + len(form)
            left = i == 0 or not _WORD.match(text[i - 1]) or not _WORD.match(form[0])
            right = j == len(text) or not _WORD.match(text[j]) or not _WORD.match(form[-1])
            if left and right:
                ends.append(j)
            i = text.find(form, i + 1)
    return ends


def _holds(block: str, name: str, args: Any, prefix: str) -> bool:
    """The block holds a call of ``name`` with ``args``: where it holds a JSON call object (``name`` and
    ``arguments``), that object, by value; else, where the template writes the name outside JSON (``prefix``), the
    name as a word and each value after its key."""
    objects = _json_calls(block)
    if objects:
        return any(obj["name"] == name and same_value(_arguments(obj["arguments"]), args) for obj in objects)
    if not prefix or not _word_at(block, name):
        return False
    if not isinstance(args, Mapping):
        text = "" if args is None else str(args)
        return "".join(text.split()) in "".join(block.split())
    if not args and "{" in block and "{}" not in "".join(block.split()):
        return False  # arguments a parser could not read, replaced by {} (verl's Kimi parser): not what was sampled
    return all(any(_value_after(block, end, value) for end in _word_at(block, str(key))) for key, value in args.items())


def _json_calls(block: str) -> list[dict[str, Any]]:
    """The JSON call objects of ``block``: a string ``name`` and ``arguments`` as an object or a JSON string."""
    return [
        value
        for kind, value in json_and_text(block)
        if kind == "json" and isinstance(value.get("name"), str) and isinstance(value.get("arguments"), dict | str)
    ]


def _arguments(value: Any) -> Any:
    """Arguments written as a JSON string read as the object they encode (a string encoded once more, as a loop keeps
    arguments that are not an object, read through)."""
    for _ in range(3):
        if not isinstance(value, str):
            break
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError:
            break
        if not isinstance(parsed, dict | str):
            break
        value = parsed
    return value


def _value_after(block: str, end: int, value: Any) -> bool:
    """A value equal to ``value`` is sampled right after a key that ends at ``end``."""
    i = end + (block[end : end + 1] == _KEY_END)
    while i < len(block) and block[i] in " \t":
        i += 1
    if i >= len(block) or block[i] not in _KEY_SEPARATORS:
        return False
    return any(same_value(value, reading) for reading in _readings(block, i + 1))


def _readings(block: str, i: int) -> list[Any]:
    """What the value starting at ``i`` may be read as: a JSON value, or raw text up to the next tag (as is, without
    the newline on each side the template writes, stripped) and the JSON or number that text reads as."""
    out: list[Any] = []
    rest = block[i:]
    stripped = rest.lstrip()
    with contextlib.suppress(json.JSONDecodeError):
        out.append(json.JSONDecoder().raw_decode(stripped)[0])
    raw = rest.split("<", 1)[0]
    out += [raw, _inner(raw), raw.strip()]
    # raw text up to a later tag: a value holding tag text (``see <tool_call> here``, a raw XML value cannot escape
    # it), or cut by the response length (``1+2\n</parameter``, read to the end of the text)
    cuts = [m.start() for m in itertools.islice(_TAG_START.finditer(rest, len(raw) + 1), _LATER_CUTS)]
    for cut in [*cuts, len(rest)]:
        out += [rest[:cut], _inner(rest[:cut]), rest[:cut].strip()]
    with contextlib.suppress(json.JSONDecodeError):
        out.append(json.loads(raw.strip()))
    # a template writing values with ``|string`` writes Python's text for them (``True``, ``None``, ``{'a': 1}``)
    with contextlib.suppress(ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        out.append(ast.literal_eval(raw.strip()))
    return out


_TAG_START = re.compile("<")
_LATER_CUTS = 8  # tags inside one raw value read past at most


def _inner(raw: str) -> str:
    """Raw text without the newline on each side a template writes around a value."""
    inner = raw[1:] if raw.startswith("\n") else raw
    return inner[:-1] if inner.endswith("\n") else inner


def _name_prefix(block: str, opener: str, name: str) -> str:
    """The text the template writes right before a call's name in its block (``<function=``, ``functions.``, the
    opener itself where the name follows it); empty where it writes the name inside a JSON object
    (``{"name": ...}``: a call then reads only as JSON)."""
    if any(kind == "json" and value.get("name") == name for kind, value in json_and_text(block)):
        return ""
    ends = _word_at(block, name)
    if not ends:
        return ""
    head = block[len(opener) : ends[0] - len(name)].split()
    return head[-1] if head else opener  # the name right after the opener (DeepSeek V3.1): the opener leads it


def _readable(block: str, prefix: str, named: bool) -> bool:
    """The block reads as a call: a JSON object with a string ``name`` and ``arguments``; or, where the message has
    calls to learn it from (``named``), a name after the text the template writes before one (``prefix``)."""
    if _json_calls(block):
        return True
    return named and bool(prefix) and re.search(re.escape(prefix) + r"\s*\w", block) is not None
