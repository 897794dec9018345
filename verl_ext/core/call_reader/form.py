"""How one chat template writes tool calls, as learned from its renders (``learn.py``), and what a read returns.

Every literal is a tuple of chunks (``literals.chunks``): reading matches them with any spacing, so only the chunks
are kept. A call is ``lead``, then the call itself in one of three encodings, then ``trail``; calls in one turn are
joined by ``sep``; the first call of a section is preceded by ``opener`` and the last followed by ``closer``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Encodings of one call.
JSON_CALL = "json object"  # {"name": ..., "arguments"|"parameters": {...}} (Hermes, Llama, Mistral, firefunction)
NAME_JSON = "name then json"  # NAME <mid> {...} (DeepSeek, Kimi, harmony, functionary, Mistral Small)
NAME_KEYED = "name then keyed parameters"  # <function=NAME><parameter=K>V</parameter> (Qwen3-Coder, Seed-OSS)
# Beside the encoding above, for the tools a template calls in Python (Llama 3.1-3.3's built-in tools, named by the
# ``builtin_tools`` template variable): <|python_tag|>NAME.call(k="v", ...)
PYTHON_CALL = "python call"

ID_SLOT = "\x01"  # where a literal holds the call's id (Mistral Small's [CALL_ID]id[ARGS])

Chunks = tuple[str, ...]


@dataclass(frozen=True)
class CallForm:
    """The learned form of a template's tool calls (see the module's doc)."""

    encoding: str
    generation_prompt: str  # the text a read turn is prefixed with (a lead may start inside it: functionary ">>>")
    opener: Chunks
    lead: Chunks
    trail: Chunks
    sep: Chunks
    closer: Chunks
    mid: Chunks = ()  # NAME_JSON, NAME_KEYED: between the name and the arguments (may hold ID_SLOT, counters)
    name_key: str = ""  # JSON_CALL: the key of the name, of the arguments, of the id ("" where none is rendered)
    arguments_key: str = ""
    id_key: str = ""
    key_pre: Chunks = ()  # NAME_KEYED: before a parameter's key, between key and value, after the value
    key_value: Chunks = ()
    value_post: Chunks = ()
    value_close: str = ""  # NAME_KEYED: the close as the template writes it, its whitespace around ("\n</parameter>\n")
    value_open: str = ""  # NAME_KEYED: the whitespace the template writes before a value ("\n" after "<parameter=K>")
    literals: Mapping[str, Any] = field(default_factory=dict)  # NAME_KEYED: rendered text of true/false/null
    content_wrap: tuple[Chunks, Chunks] | None = None  # text around the content before the calls (harmony)
    content_pad: str = ""  # the whitespace the template writes between the wrap's head and the content (">>>all\n")
    several: bool = True  # the template renders several calls in one turn
    python_lead: Chunks = ()  # before a PYTHON_CALL (<|python_tag|>); empty: the template renders none

    def describe(self) -> str:
        """One line naming the form: the encoding and the literals around a call."""

        def lit(c: Chunks) -> str:
            return "".join(c).replace(ID_SLOT, "ID").replace("\x00", "N") or "-"

        keys = f" (keys {self.name_key!r}, {self.arguments_key!r})" if self.encoding == JSON_CALL else ""
        return (
            f"{self.encoding}{keys}: section {lit(self.opener)}, each call {lit(self.lead)} ... {lit(self.trail)}"
            + (f", between name and arguments {lit(self.mid)}" if self.mid else "")
            + (f"; built-in tools as {PYTHON_CALL}s: {lit(self.python_lead)}NAME.call(...)" if self.python_lead else "")
        )


@dataclass(frozen=True)
class ReadCall:
    """One call read from a turn: its name, its arguments as JSON text, the id the model wrote (None: none)."""

    name: str
    arguments: str
    call_id: str | None = None


@dataclass(frozen=True)
class ReadTurn:
    """A turn read by the derived reader: the content (text outside the calls), the calls, and how many call
    sections were opened but held no readable call (``malformed``). ``spans``: where each call lies in the text read,
    ``[start, end)`` in characters from its lead to its trail (a marker inside a JSON string is text: JSON decoding
    decides where a JSON call ends); ``unread``: each section opened but not read, ``(start, end, closed)``, to its
    trail (``closed``) or to the next section or the end."""

    content: str
    calls: tuple[ReadCall, ...]
    malformed: int
    spans: tuple[tuple[int, int], ...] = ()
    unread: tuple[tuple[int, int, bool], ...] = ()
