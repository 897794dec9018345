"""What is wrong with one reading of a turn's calls, by class: the facts that decide between two readings of it.

verl's parser and the reader derived from the template may read one turn differently (``turn_parse.parse_turn``
takes the reading with no fault where the other has one). Each class is a fact about a reading checked against the
turn's text, the template's learned form and the tools offered, never a rule about one model or one parser:

- ``CALL_TEXT_LEFT``: call-like text outside the reading's calls (``leftover.call_text_left``; verl's hermes parser
  cuts a call at a ``</tool_call>`` inside a JSON string and leaves the rest in the content);
- ``NAME_NOT_OFFERED``: a call names a tool the turn was not offered, and the text writes no call of that name (verl's
  kimi parser reads the id ``functions.get-weather:0`` as the name where it cannot map it to a tool); a tool not
  offered that the model called is what it wrote, no fault;
- ``NOT_WRITTEN``: a call the text does not hold where the form writes one (``CallReader.writes``: its name is not
  after the form's lead, or its JSON arguments are not the object written after it: verl's kimi parser reads a call
  cut at a marker inside a string as arguments ``{}``);
- ``TYPE_MISFIT``: an argument kept as text where its parameter declares another type and the text is a value of
  that type as the template writes it (verl's seed parser keeps the template's ``True`` and Python lists as
  strings); a value the model wrote of another type is what it wrote, no fault.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Sequence
from typing import Any

from verl_ext.core.call_reader.read import CallReader

CALL_TEXT_LEFT = "call text left outside the calls"
NAME_NOT_OFFERED = "a call names a tool not offered"
NOT_WRITTEN = "a call the text does not hold where the template writes one"
TYPE_MISFIT = "an argument kept as text where its parameter declares another type"

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
            value, decoded = json.loads(arguments), True
        except (json.JSONDecodeError, TypeError):
            value, decoded = None, False
        # arguments that are JSON but no object ("1+1") are the model's own mistake, kept as it wrote them (the tool
        # answers bad_arguments); a reading that cannot decode them, or an object the text does not hold, misread
        written = reader.writes(text, name, value) if isinstance(value, dict) else decoded
        if not written:
            faults.add(NOT_WRITTEN)
        if types and name not in types and not reader.writes(text, name):  # a tool not offered the model wrote is
            faults.add(NAME_NOT_OFFERED)  # what it wrote
        declared = types.get(name) or {}
        literals = reader.form.literals
        if isinstance(value, dict) and any(_kept_as_text(v, declared.get(k), literals) for k, v in value.items()):
            faults.add(TYPE_MISFIT)
    return frozenset(faults)


def _kept_as_text(value: Any, declared: Any, literals: Mapping[str, Any]) -> bool:
    """Whether ``value`` is a string that the reading kept as text where the parameter declares another type and
    the text is a value of that type as templates write it (the form's literal for true/false/null, JSON, a Python
    literal): a value the model wrote of another type (a number for a string) is what it wrote, no fault."""
    if not isinstance(value, str) or _fits(value, declared):
        return False
    text = value.strip()
    if text in literals:
        return _fits(literals[text], declared)
    try:
        return _fits(json.loads(text), declared)
    except json.JSONDecodeError:
        pass
    try:
        return text[:1] in "[{(" and _fits(ast.literal_eval(text), declared)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return False


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
