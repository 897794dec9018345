"""The shape of an OpenAI-format message, checked before a template renders it.

Jinja renders whatever it is given: an assistant ``content`` of ``5`` becomes ``"5"`` under one template and
nothing under another, and a ``tool_calls`` that is a string renders garbage. A message is refused here, with
its index, the field and the fix, instead of being rendered silently.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# Optional string fields a message may carry (tool results, reasoning).
_STRING_FIELDS = ("name", "tool_call_id", "reasoning_content", "thinking")


def json_type(value: Any) -> str:
    """The JSON name of a value's type, for messages that say what was found."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, list | tuple):
        return "a list"
    return type(value).__name__


def message_problem(message: Any) -> str | None:
    """What is wrong with one message (a phrase naming the field and the fix), or None when it is well formed."""
    if not isinstance(message, Mapping):
        return f"must be an object with a string 'role', got {json_type(message)}"
    role = message.get("role")
    if not isinstance(role, str) or not role:
        return f'\'role\' must be a non-empty string such as "user" or "assistant", got {json_type(role)}'
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        if not isinstance(content, list):
            hint = f' (write it as a string: "{content}")' if isinstance(content, int | float) else ""
            return f"'content' must be a string, a list of content parts or null, got {json_type(content)}{hint}"
        for k, part in enumerate(content):
            if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
                return f"'content'[{k}] must be a content part object with a string 'type', got {json_type(part)}"
            if part.get("type") == "text" and not isinstance(part.get("text"), str):
                return f"'content'[{k}] is a text part whose 'text' is {json_type(part.get('text'))}, not a string"
    for key in _STRING_FIELDS:
        if message.get(key) is not None and not isinstance(message[key], str):
            return f"'{key}' must be a string, got {json_type(message[key])}"
    calls = message.get("tool_calls")
    if calls is not None:
        if role != "assistant":
            return f"'tool_calls' belongs on an assistant message, not on a {role!r} message"
        if not isinstance(calls, list):
            return f"'tool_calls' must be a list of tool calls, got {json_type(calls)}"
        for k, call in enumerate(calls):
            problem = _tool_call_problem(call)
            if problem:
                return f"'tool_calls'[{k}] {problem}"
    return None


def _tool_call_problem(call: Any) -> str | None:
    if not isinstance(call, Mapping):
        return f"must be an object with a 'function', got {json_type(call)}"
    function = call.get("function")
    if not isinstance(function, Mapping):
        return f"needs a 'function' object with 'name' and 'arguments', got {json_type(function)}"
    if not isinstance(function.get("name"), str):
        return f"'function'.'name' must be a string, got {json_type(function.get('name'))}"
    arguments = function.get("arguments")
    if arguments is not None and not isinstance(arguments, str | Mapping):
        return f"'function'.'arguments' must be a JSON object or a string holding one, got {json_type(arguments)}"
    if call.get("id") is not None and not isinstance(call["id"], str):
        return f"'id' must be a string, got {json_type(call['id'])}"
    return None


def first_message_problem(messages: Sequence[Any], first_index: int = 0) -> str | None:
    """``messages[i]: <problem>`` for the first malformed message (``first_index`` numbers them), or None."""
    for k, message in enumerate(messages):
        problem = message_problem(message)
        if problem:
            return f"messages[{first_index + k}]: {problem}"
    return None
