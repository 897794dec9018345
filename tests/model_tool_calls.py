"""Tool-call turns written the ways real models write them, in the formats verl 0.9.1's parsers read.

A model trained on a template writes its calls mostly as the template does, but not byte for byte: a space or
nothing instead of the newline after ``<tool_call>``, compact separators, ``arguments`` before ``name``, numbers
as ``1e2``, ``2.50`` or ``-0.0``, ``ensure_ascii`` escapes (``"caf\\u00e9"``), non-ASCII text, one to three calls
with or without newlines between them, text right before a call, after a reasoning block or without one, and
call-marker text inside string arguments (``"</tool_call>"``, ``"<tool_call>"``, a code fence, the template's other
tags: an agent editing code about tool calls writes them). And now and then a call the parser cannot read
(``"parameters"`` for ``"arguments"``, broken JSON), which the parser takes out of the content and the loop answers
with an error tool message.

``turn_text(fmt, ...)`` draws one such turn's text (no stop: the caller ends it); ``FORMATS`` names the formats and
the verl parser each is read by. Every string here is text a model may sample, as written (JSON numbers and escapes
are kept as the model wrote them, never re-dumped).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from hypothesis import strategies as st

# String arguments holding call-marker text: a marker inside a JSON string is text, never a call's edge.
MARKER_STRINGS = (
    '"a </tool_call> b"',
    '"<tool_call>"',
    '"```json\\n{\\"name\\": \\"x\\"}\\n```"',
    '"</tool_call>\\n<tool_call>"',
    '"<tool_response>ok</tool_response>"',
    '"<function=calculator>"',
)
# JSON values as models write them: the text as sampled.
JSON_VALUES = (
    '"1+2"',
    "1e2",
    "2.50",
    "-0.0",
    "7",
    '"caf\\u00e9"',
    '"café"',
    '"a\\u00a0b"',
    '"a\u00a0b"',
    '"中文 text"',
    '"🙂"',
    '"line\\nbreak"',
    '"say \\"hi\\""',
    "true",
    "null",
    "[1, 2.0]",
    '{"k": 1e2}',
    *MARKER_STRINGS,
)
# Values in the XML formats (qwen3_coder, seed), where a parameter's value is raw text.
XML_VALUES = ("1+2", "100", "2.50", "café", "a\u00a0b", "中文 text", "two\nlines", "x y")
KEYS = ("expression", "x", "query")
NAMES = ("calculator", "search")
# Text a model writes right before its calls.
LEADS = ("", "Let me compute that.\n\n", "I'll use the calculator. ", "Sure:\n", "好的，")
# A reasoning block a model writes before its calls (thinking on), or none.
REASONING = ("", "<think>\nI need the calculator.\n</think>\n\n", "<think>\nhm</think>\n", "<think>\n\n</think>\n\n")

# format -> the verl parser that reads it (``ToolParser.get_tool_parser`` name)
FORMATS = {"hermes": "hermes", "qwen3_coder": "qwen3_coder", "gpt-oss": "gpt-oss", "kimi": "kimi", "seed": "seed"}
# The formats where a call verl's parser cannot read is left out of the message and counted (``malformed_count``:
# parsers with a ``tool_call_regex`` whose blocks it reads one call each).
MALFORMED_FORMATS = frozenset({"hermes", "seed"})


@st.composite
def json_object(draw: Any, keys: Sequence[str] = KEYS, min_size: int = 1) -> str:
    """A JSON object as a model writes it: 1-2 drawn keys, values as written, standard or compact separators."""
    chosen = draw(st.lists(st.sampled_from(keys), min_size=min_size, max_size=2, unique=True))
    item, colon = draw(st.sampled_from([(", ", ": "), (",", ":"), (", ", ":")]))
    pairs = [
        f"{json.dumps(k, ensure_ascii=draw(st.booleans()))}{colon}{draw(st.sampled_from(JSON_VALUES))}" for k in chosen
    ]
    return "{" + item.join(pairs) + "}"


@st.composite
def hermes_call(draw: Any, malformed: bool = False) -> str:
    """``<tool_call>`` JSON ``</tool_call>``: newline, space or nothing inside the tags, ``name`` or ``arguments``
    first, standard or compact separators. ``malformed``: ``parameters`` for ``arguments``, or broken JSON."""
    return draw(hermes_call_read(malformed))[0]


Call = tuple[str, Any]  # a call's name and its arguments as the model meant them


@st.composite
def hermes_call_read(draw: Any, malformed: bool = False) -> tuple[str, Call | None, Call | None]:
    """``hermes_call``'s text, the call it holds as the template writes calls (None: malformed), and the call a
    lenient reader reads from it (the derived reader reads ``parameters`` for ``arguments``; None: broken JSON)."""
    head, tail = draw(st.sampled_from(["\n", " ", ""])), draw(st.sampled_from(["\n", " ", ""]))
    item, colon = draw(st.sampled_from([(", ", ": "), (",", ":")]))
    name = json.dumps(draw(st.sampled_from(NAMES)))
    args = draw(json_object())
    key = "arguments"
    if malformed:
        how = draw(st.sampled_from(["parameters", "unclosed", "bare"]))
        if how == "parameters":
            key = "parameters"
        elif how == "unclosed":
            args = args[:-1]
        else:
            name = name.strip('"')
    fields = [f'"name"{colon}{name}', f'"{key}"{colon}{args}']
    if draw(st.booleans()):
        fields.reverse()
    text = f"<tool_call>{head}{{{item.join(fields)}}}{tail}</tool_call>"
    try:
        lenient: Call | None = (json.loads(name), json.loads(args))
    except json.JSONDecodeError:
        lenient = None
    return text, lenient if key == "arguments" else None, lenient


@st.composite
def hermes_turn_read(draw: Any, reasoning: bool = True, malformed: bool = True) -> tuple[str, list[Call], list[Call]]:
    """A hermes turn as ``turn_text`` draws it, with the calls it holds as the template writes them, and the calls
    a lenient reader reads (``hermes_call_read``)."""
    think = draw(st.sampled_from(REASONING)) if reasoning else ""
    lead = draw(st.sampled_from(LEADS))
    drawn = [draw(hermes_call_read(malformed and draw(st.integers(0, 3)) == 0)) for _ in range(draw(st.integers(1, 3)))]
    between = draw(st.sampled_from(["\n", "", "\n\n"]))
    text = think + lead + between.join(t for t, _, _ in drawn)
    return text, [c for _, c, _ in drawn if c is not None], [c for _, _, c in drawn if c is not None]


@st.composite
def qwen3_coder_call(draw: Any) -> str:
    """``<tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></tool_call>`` with the template's
    newlines, or some of them left out."""
    nl = draw(st.sampled_from(["\n", ""]))
    keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=2, unique=True))
    params = "".join(f"<parameter={k}>{nl}{draw(st.sampled_from(XML_VALUES))}{nl}</parameter>\n" for k in keys)
    return f"<tool_call>\n<function={draw(st.sampled_from(NAMES))}>\n{params}</function>{nl}</tool_call>"


@st.composite
def seed_call(draw: Any, malformed: bool = False) -> str:
    """``<seed:tool_call><function=NAME><parameter=KEY>VALUE</parameter></function></seed:tool_call>``, newlines
    as the template writes them or left out. ``malformed``: no ``<function=...>`` header (the parser reads none)."""
    nl = draw(st.sampled_from(["\n", ""]))
    keys = draw(st.lists(st.sampled_from(KEYS), min_size=1, max_size=2, unique=True))
    params = "".join(f"<parameter={k}>{draw(st.sampled_from(XML_VALUES))}</parameter>{nl}" for k in keys)
    head = "" if malformed else f"<function={draw(st.sampled_from(NAMES))}>{nl}"
    return f"<seed:tool_call>{nl}{head}{params}</function>{nl}</seed:tool_call>"


@st.composite
def kimi_calls(draw: Any, count: int) -> str:
    """Kimi K2's section: ``functions.NAME:INDEX`` then JSON arguments per call, with or without newlines between."""
    sep = draw(st.sampled_from(["", "\n"]))
    calls = [
        f"<|tool_call_begin|>functions.{draw(st.sampled_from(NAMES))}:{k}<|tool_call_argument_begin|>"
        f"{draw(json_object())}<|tool_call_end|>"
        for k in range(count)
    ]
    return f"<|tool_calls_section_begin|>{sep}{sep.join(calls)}{sep}<|tool_calls_section_end|>"


@st.composite
def gpt_oss_turn(draw: Any) -> str:
    """A harmony turn after ``<|start|>assistant``: analysis or not, then one call to
    ``functions.NAME`` with JSON arguments (the engine stops on ``<|call|>``, which the caller appends)."""
    text = ""
    if draw(st.booleans()):
        text += "<|channel|>analysis<|message|>I need the calculator.<|end|><|start|>assistant"
    # (a commentary preamble before the call is left out: verl's gpt-oss parser keeps it in the content with its
    # <|end|>, and the check rightly reports that stop text in the message; docs/check.md, "Not yet there")
    name = draw(st.sampled_from(NAMES))
    return text + f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{draw(json_object())}"


@st.composite
def turn_text(draw: Any, fmt: str, reasoning: bool = True, malformed: bool = True) -> str:
    """One assistant turn's text in ``fmt`` (a key of ``FORMATS``): a reasoning block or not (``reasoning``: the
    template's generation prompt leaves thinking to the model), text or not, then one to three calls (one on
    gpt-oss, whose engine stops at a call), separated by nothing, a newline or a blank line; in the formats of
    ``MALFORMED_FORMATS`` one call in four is one the parser cannot read (``malformed``)."""
    if fmt == "gpt-oss":
        return draw(gpt_oss_turn())
    think = draw(st.sampled_from(REASONING)) if reasoning else ""
    lead = draw(st.sampled_from(LEADS))
    count = draw(st.integers(1, 3))
    if fmt == "kimi":
        return think + lead + draw(kimi_calls(count))
    bad = [malformed and fmt in MALFORMED_FORMATS and draw(st.integers(0, 3)) == 0 for _ in range(count)]
    if fmt == "hermes":
        calls = [draw(hermes_call(b)) for b in bad]
    elif fmt == "qwen3_coder":
        calls = [draw(qwen3_coder_call()) for _ in bad]
    elif fmt == "seed":
        calls = [draw(seed_call(b)) for b in bad]
    else:
        raise ValueError(f"unknown tool-call format {fmt!r}; known: {sorted(FORMATS)}")
    between = draw(st.sampled_from(["\n", "", "\n\n"]))
    return think + lead + between.join(calls)
