"""What is wrong with one reading of a turn's calls, by class: the facts that decide between two readings of it.

verl's parser and the reader derived from the template may read one turn differently (``turn_parse.parse_turn``
takes the reading with no fault where the other has one). Each class is a fact about a reading checked against the
turn's text, the template's learned form and the tools offered, never a rule about one model or one parser:

- ``CALL_TEXT_LEFT``: call-like text outside the reading's calls (``leftover.call_text_left``; verl's hermes parser
  cuts a call at a ``</tool_call>`` inside a JSON string and leaves the rest in the content);
- ``NAME_NOT_OFFERED``: a call names a tool the turn was not offered (verl's kimi parser reads the id
  ``functions.get-weather:0`` as the name where it cannot map it to a tool);
- ``NOT_WRITTEN``: a call the text does not hold where the form writes one (``CallReader.writes``: its name is not
  after the form's lead, or its JSON arguments are not the object written after it: verl's kimi parser reads a call
  cut at a marker inside a string as arguments ``{}``);
- ``TYPE_MISFIT``: an argument whose value is not of the type its parameter declares (verl's seed parser keeps the
  template's ``True``, ``None`` and Python lists as strings).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from verl_ext.core.call_reader.read import CallReader

CALL_TEXT_LEFT = "call text left outside the calls"
NAME_NOT_OFFERED = "a call names a tool not offered"
NOT_WRITTEN = "a call the text does not hold where the template writes one"
TYPE_MISFIT = "an argument not of its parameter's declared type"

# JSON Schema type -> the Python types of a JSON value of it (a bool is no integer or number)
_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "null": (type(None),),
    "object": (dict,),
    "array": (list,),
}


def call_faults(
    reader: CallReader,
    text: str,
    calls: Sequence[tuple[str, str]],
    types: Mapping[str, Mapping[str, Any]],
) -> frozenset[str]:
    """The fault classes of a reading's ``calls`` (name, arguments as JSON text) of ``text`` (the turn as the reader
    reads it), given ``types`` (parameter types per offered tool, ``parameter_types``; empty: no tools offered, and
    no name or type is judged)."""
    faults: set[str] = set()
    for name, arguments in calls:
        try:
            value = json.loads(arguments)
        except (json.JSONDecodeError, TypeError):
            value = None
        if not isinstance(value, dict) or not reader.writes(text, name, value):
            faults.add(NOT_WRITTEN)
        if types and name not in types:
            faults.add(NAME_NOT_OFFERED)
        declared = types.get(name) or {}
        if isinstance(value, dict) and any(not _fits(v, declared.get(k)) for k, v in value.items()):
            faults.add(TYPE_MISFIT)
    return frozenset(faults)


def _fits(value: Any, declared: Any) -> bool:
    """Whether ``value`` is of the ``declared`` JSON Schema type (a name or a list of names; none or unknown: any).
    A null fits any type: models write it for a parameter they leave unset, and both readings read it alike."""
    if value is None:
        return True
    names = declared if isinstance(declared, list) else [declared]
    kinds = [_TYPES[n] for n in names if isinstance(n, str) and n in _TYPES]
    if not kinds or len(kinds) < len(names):
        return True
    if isinstance(value, bool):
        return any(bool in k for k in kinds)
    return any(isinstance(value, k) for k in kinds)
