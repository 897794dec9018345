"""A call written in Python (``NAME.call(k="v", n=1)``, Llama 3.1-3.3's built-in tools) read into name and arguments.

The template writes every argument as ``k="v"``; a model may write other spacing, single quotes, numbers, booleans
(``True``), ``None``, lists and dicts: any Python literal as a keyword argument is read. What is not one call of that
shape (code for the interpreter, a positional argument, a variable, an unclosed call) is no call: None.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from verl_ext.core.call_reader.form import ReadCall

_HEAD = re.compile(r"\s*(?P<name>[A-Za-z_]\w*)\.call\(")
_MAX_TRIES = 256  # closing parentheses tried as the call's end (a string argument may hold some)


def read_python_call(text: str, at: int) -> tuple[ReadCall | None, int]:
    """The call written at ``at`` (after whitespace) and where it ends; (None, at) where none is written there."""
    m = _HEAD.match(text, at)
    if m is None:
        return None, at
    start, i = m.start("name"), m.end()
    for _ in range(_MAX_TRIES):
        j = text.find(")", i)
        if j < 0:
            break
        try:
            tree = ast.parse(text[start : j + 1], mode="eval")
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            i = j + 1
            continue
        args = _keyword_literals(tree.body, m.group("name"))
        if args is None:
            return None, at
        return ReadCall(m.group("name"), json.dumps(args, ensure_ascii=False)), j + 1
    return None, at


def _keyword_literals(node: ast.expr, name: str) -> dict[str, Any] | None:
    """``name.call(k=literal, ...)``'s keywords and their values; None for any other expression."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "call"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == name
        and not node.args
    ):
        return None
    out: dict[str, Any] = {}
    for keyword in node.keywords:
        if keyword.arg is None:  # **kwargs
            return None
        try:
            value = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return None
        if not _json_value(value):
            return None
        out[keyword.arg] = value
    return out


def _json_value(value: Any) -> bool:
    """A value JSON can carry as the arguments' value (no tuples, sets, bytes, complex numbers, non-string keys)."""
    if value is None or isinstance(value, bool | int | str):
        return True
    if isinstance(value, float):
        return value == value and value not in (float("inf"), float("-inf"))
    if isinstance(value, list):
        return all(_json_value(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_value(v) for k, v in value.items())
    return False
