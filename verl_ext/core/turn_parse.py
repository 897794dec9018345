"""One sampled turn's ids read as an assistant message: the one parse step every verl_ext loop shares.

``verl_ext_tool_agent`` and the gateway both call ``parse_turn``, so the same ids give the same message, the same
calls and the same count of malformed calls in both. The tool parser is verl's ``ToolParser`` (hermes, gpt-oss,
qwen3_coder, ...), used through its interface only (``extract_tool_calls``, ``tool_call_regex``): nothing here
imports verl, so the gateway's core stays free of verl, Ray and torch. verl's parser is the default; the reader
derived from the chat template (``verl_ext.core.call_reader``) reads the turn where there is no verl parser, or where
verl's reads no call and the derived reader reads one (``ParsedTurn.derived``, counted ``tool/derived_reads``).
Where both read calls and their calls differ (``ParsedTurn.disagree``, counted ``tool/readings_disagree``), each
reading is judged by fault class (``call_reader.faults``: call-like text left outside its calls, a tool not offered,
a call the text does not hold where the template writes one, an argument not of its declared type): the derived
reading is taken where its faults are a part of verl's (verl's hermes parser cuts a call at a ``</tool_call>``
inside a JSON string and leaves the rest in the content; verl's kimi parser reads ``functions.get-weather:0`` as a
name; verl's seed parser keeps ``True`` as a string); elsewhere verl's, as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.core.call_reader import CallForm, CallReader, ReadTurn, parameter_types
from verl_ext.core.call_reader.faults import CALL_TEXT_LEFT, call_faults
from verl_ext.core.call_reader.leftover import call_text_left
from verl_ext.core.turn_end import message_body


@dataclass(frozen=True)
class ParsedCall:
    """One tool call the parser read from a turn's output."""

    name: str
    arguments: str  # JSON text as the model wrote it (verl re-dumps parsed JSON)
    call_id: str


@dataclass(frozen=True)
class ParsedTurn:
    """One assistant turn read from its output ids: the message for the template (every call the model wrote, so
    that it describes the sampled tokens, and the content as the parser returned it, reasoning included), the calls
    within the caller's limit, the calls read past that limit, and how many tool calls the parser could not read."""

    message: dict[str, Any]
    calls: list[ParsedCall]
    dropped: list[ParsedCall]
    malformed: int
    derived: bool = False  # the calls were read by the reader derived from the template, not by verl's parser
    disagree: bool = False  # verl's parser and the derived reader both read calls, and not the same ones
    faults: tuple[str, ...] = ()  # the fault classes of the reading not taken (``call_reader.faults``): why it lost


def call_id(turn: int, index: int) -> str:
    """A 9-character alphanumeric id (Mistral's templates require exactly that) when the model wrote none."""
    return f"c{turn:04d}{index:04d}"


def malformed_count(parser: Any, text: str, parsed: int) -> int:
    """Tool-call blocks the parser saw but could not read (parsers with a ``tool_call_regex``, e.g. hermes)."""
    regex = getattr(parser, "tool_call_regex", None)
    if regex is None:
        return 0
    return max(0, len(regex.findall(text)) - parsed)


def arguments_object(text: str) -> Any:
    """Tool-call arguments as a JSON object where the text parses to one, else the text as written."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text
    return value if isinstance(value, dict) else text


def assistant_message(content: str, calls: Sequence[ParsedCall]) -> dict[str, Any]:
    """The assistant message for the template: ``content``, and ``tool_calls`` when there are calls (arguments as
    a JSON object where they parse to one, else the text the model wrote)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {
                "id": c.call_id,
                "type": "function",
                "function": {"name": c.name, "arguments": arguments_object(c.arguments)},
            }
            for c in calls
        ]
    return message


@dataclass(frozen=True)
class _Reading:
    """One text the parser read for a turn: the ids it was given, and the text to take off the content's ends."""

    ids: list[int]
    head: str  # the generation prompt's text, taken off the start of the content where it starts with it
    tail: str  # the stop's text, taken off the end of the content where it ends with it


def _readings(
    ids: Sequence[int],
    end_of_turn_ids: frozenset[int],
    generation_prompt: Sequence[int],
    decode: Callable[[Sequence[int]], str],
) -> Iterator[_Reading]:
    """The turn as parsers may need it, from the least added to the most (each built when asked for): the ids minus
    an end-of-turn stop; the ids as sampled (a parser may match the stop, as gpt-oss's matches ``<|call|>``); the
    generation prompt then the ids (a parser may match the header the prompt pre-filled, as gpt-oss's matches
    ``<|start|>assistant``)."""
    ids = list(ids)
    stopped = bool(ids) and ids[-1] in end_of_turn_ids
    # only an end-of-turn stop is not content; a user stop id such as </tool_call> is part of the call
    yield _Reading(ids[:-1] if stopped else ids, "", "")
    tail = decode(ids[-1:]) if stopped else ""
    if stopped:
        yield _Reading(ids, "", tail)
    if generation_prompt:
        yield _Reading([*generation_prompt, *ids], decode(generation_prompt), tail)


def _content(text: str, reading: _Reading) -> str:
    """The parser's content minus the text the reading added: the prompt's header and the stop are rendered by the
    template around the message, so in the content they would be written twice (a stop text: a fake turn end)."""
    if reading.head and text.startswith(reading.head):
        text = text[len(reading.head) :]
    if reading.tail and text.endswith(reading.tail):
        text = text[: -len(reading.tail)]
    return text


async def parse_turn(
    tool_parser: Any,
    ids: Sequence[int],
    end_of_turn_ids: frozenset[int],
    decode: Callable[[Sequence[int]], str],
    schemas: Sequence[Any],
    turn: int,
    max_parallel_calls: int | None,
    *,
    generation_prompt: Sequence[int],
    call_reader: CallReader | None = None,
) -> ParsedTurn:
    """One turn's output ids read by verl's ``tool_parser`` (the ids themselves stay as sampled). The parser reads
    the ids minus an end-of-turn stop, then the ids with it, then ``generation_prompt`` (the ids the template's
    generation prompt ended the prompt with) and the ids, up to the first reading that reads a call (none: the
    first reading), and the header's and stop's text are taken off its content. A parser that reads its calls
    without the stop or the header is given neither: it may read more into them (qwen3_coder reads an unclosed
    parameter to the end of its text, the stop included); and a turn with calls costs it one reading. ``decode``
    decodes ids to text (to count malformed calls); ``schemas`` are verl's tool schemas the parser may use; calls
    past ``max_parallel_calls`` are ``dropped`` (None: no limit, every call is in ``calls``).

    ``call_reader`` (the reader derived from the template) reads the ids minus an end-of-turn stop too: its reading
    is taken where ``tool_parser`` is None, where verl's parser read no call and it reads one, and where verl's read
    calls and the two readings disagree (``disagree``: other calls, or call-like text left by one only) and the
    derived reading's faults are a part of verl's (``call_reader.faults``; call-like text left is ``call_text_left``,
    or more blocks verl's could not read than the derived reader's closed unread sections); a turn so read is marked
    ``derived``, and a turn whose readings disagree names the faults of the reading not taken (``faults``).
    """
    if tool_parser is not None:
        content, parsed, malformed = await _verl_reading(
            tool_parser, ids, end_of_turn_ids, decode, schemas, turn, generation_prompt
        )
        if call_reader is None:
            return _turn(content, parsed, malformed, max_parallel_calls)
    if call_reader is None:
        raise ValueError("parse_turn needs verl's tool parser or a call reader derived from the template")
    text = decode(message_body(ids, end_of_turn_ids))
    offered = parameter_types(schemas)
    read = call_reader.read(text, offered)
    calls = [ParsedCall(c.name, c.arguments, c.call_id or call_id(turn, i)) for i, c in enumerate(read.calls)]
    if tool_parser is None or (not parsed and calls):
        return _turn(read.content, calls, read.malformed, max_parallel_calls, derived=bool(calls))
    verl_left, derived_left = _text_left(call_reader.form, text, content, malformed, read)
    verl_faults = {CALL_TEXT_LEFT} if verl_left else set()
    derived_faults = {CALL_TEXT_LEFT} if derived_left else set()
    differ = _meanings(parsed) != _meanings(calls)
    if differ:  # the calls themselves judged (a fact of the calls: readings of the same calls share it)
        verl_faults |= call_faults(call_reader, text, [(c.name, c.arguments) for c in parsed], offered)
        derived_faults |= call_faults(call_reader, text, [(c.name, c.arguments) for c in calls], offered)
    disagree = bool(parsed) and (differ or verl_left != derived_left)
    # the derived reading is taken where its faults are a part of verl's (a tool not offered that both name, say)
    if (disagree or not parsed) and derived_faults < verl_faults:  # (no call read: the content alone differs)
        return _turn(
            read.content,
            calls,
            read.malformed,
            max_parallel_calls,
            derived=bool(calls),
            disagree=disagree,
            faults=tuple(sorted(verl_faults)),
        )
    lost = tuple(sorted(derived_faults)) if disagree else ()
    return _turn(content, parsed, malformed, max_parallel_calls, disagree=disagree, faults=lost)


def _text_left(form: CallForm, text: str, content: str, malformed: int, read: ReadTurn) -> tuple[bool, bool]:
    """Whether verl's reading (``content``, ``malformed``) and the derived one (``read`` of ``text``) each leave
    call-like text outside their calls."""
    # Call-like text each reading leaves outside its calls, a closed block both count malformed aside: verl's parser
    # takes the blocks it could not read out of its content (a block cut inside a JSON string is one), so more of
    # them than the derived reader's closed unread sections is text it left; the derived reader keeps its unread
    # sections in the content, and what it leaves outside its calls and those is left.
    closed = [(a, b) for a, b, whole in read.unread if whole]
    # an unclosed section verl's content holds as written (a call cut by the stop) is left by both: neither's fault
    both = [(a, b) for a, b, whole in read.unread if not whole and text[a:b] in content]
    verl_rest = content
    for a, b in both:
        verl_rest = verl_rest.replace(text[a:b], "", 1)
    verl_left = call_text_left(form, verl_rest) is not None or malformed > len(closed)
    # what the derived reader consumed (sections from their opener to their close) is out of its content already
    derived_rest = read.content
    for a, b in [*closed, *both]:
        derived_rest = derived_rest.replace(text[a:b], "", 1)
    derived_left = call_text_left(form, derived_rest) is not None
    return verl_left, derived_left


def _meanings(calls: Sequence[ParsedCall]) -> list[tuple[str, str]]:
    """Each call's name and arguments by meaning (JSON canonical: verl re-dumps what it parsed), to compare two
    readings of one turn."""
    out = []
    for c in calls:
        try:
            arguments = json.dumps(json.loads(c.arguments), sort_keys=True, ensure_ascii=False)
        except (json.JSONDecodeError, TypeError):
            arguments = c.arguments
        out.append((c.name, arguments))
    return out


def _turn(
    content: str,
    parsed: list[ParsedCall],
    malformed: int,
    max_parallel_calls: int | None,
    derived: bool = False,
    disagree: bool = False,
    faults: tuple[str, ...] = (),
) -> ParsedTurn:
    limit = len(parsed) if max_parallel_calls is None else max(0, max_parallel_calls)
    message = assistant_message(content, parsed)
    return ParsedTurn(message, parsed[:limit], parsed[limit:], malformed, derived, disagree, faults)


async def _verl_reading(
    tool_parser: Any,
    ids: Sequence[int],
    end_of_turn_ids: frozenset[int],
    decode: Callable[[Sequence[int]], str],
    schemas: Sequence[Any],
    turn: int,
    generation_prompt: Sequence[int],
) -> tuple[str, list[ParsedCall], int]:
    """verl's parser over the readings (``parse_turn``): the content, the calls, the malformed count."""
    read: list[tuple[_Reading, str, list[Any]]] = []
    for reading in _readings(ids, end_of_turn_ids, generation_prompt, decode):
        content, found = await tool_parser.extract_tool_calls(reading.ids, list(schemas))
        read.append((reading, content, list(found)))
        if found:
            break
    reading, content, found = read[-1] if read[-1][2] else read[0]
    parsed = [ParsedCall(c.name, c.arguments, c.tool_call_id or call_id(turn, i)) for i, c in enumerate(found)]
    malformed = malformed_count(tool_parser, decode(reading.ids), len(found))
    return _content(content, reading), parsed, malformed
