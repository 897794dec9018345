"""The shape in which a chat template accepts an assistant turn's tool calls, and messages put into that shape.

Templates disagree on the input convention of a tool call: most take ``content: ""`` and ``arguments`` as a
mapping; DeepSeek-style templates concatenate ``arguments`` as a string (the OpenAI wire format) and render a
stray empty turn unless ``content`` is None; some render only the call's name, some no call at all. The probe
derives the shape that works (``derive_tool_call_shape``) and every render of the rollout and of the check puts
messages into it (``ToolCallShape.conform``), so that the template sees one convention throughout.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.core.errors import TemplateError

# What a template renders of a tool call.
RENDERS_ARGUMENTS = "arguments"  # the call's arguments (and usually its name)
RENDERS_NAME = "name only"  # the call's name, not its arguments
RENDERS_NOTHING = "not rendered"  # nothing of the call: it can only live in the assistant's content text

ARGUMENTS_OBJECT = "object"  # the template needs a mapping (a string raises or is not rendered)
ARGUMENTS_STRING = "json string"  # the template needs a JSON string (a mapping raises or is not rendered)
ARGUMENTS_EITHER = "either"  # both render: messages are left as they are


@dataclass(frozen=True)
class ToolCallShape:
    """How an assistant message with tool calls must look for this template to render it."""

    content_none: bool = False  # content is None (not "") when the turn has no text besides its calls
    arguments: str = ARGUMENTS_EITHER
    renders: str = RENDERS_ARGUMENTS

    def conform(self, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """``messages`` with every assistant tool-call turn in this shape (other messages untouched)."""
        return [
            self._conform_one(m) if m.get("role") == "assistant" and m.get("tool_calls") else dict(m) for m in messages
        ]

    def _conform_one(self, message: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(message)
        content = out.get("content")
        if self.content_none and content == "":
            out["content"] = None
        elif not self.content_none and content is None:
            out["content"] = ""
        out["tool_calls"] = [self._conform_call(c) for c in out["tool_calls"]]
        return out

    def _conform_call(self, call: Any) -> Any:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            return call
        args = function.get("arguments")
        if self.arguments == ARGUMENTS_STRING and isinstance(args, Mapping):
            args = json.dumps(args, ensure_ascii=False)
        elif self.arguments == ARGUMENTS_OBJECT and isinstance(args, str):
            try:
                parsed = json.loads(args)
            except json.JSONDecodeError:
                parsed = None
            args = parsed if isinstance(parsed, Mapping) else args
        return {**call, "function": {**function, "arguments": args}}


def derive_tool_call_shape(
    render: Callable[[str | None, Any], str], argument_marker: str, name_marker: str, name_count: int
) -> tuple[ToolCallShape, list[str]]:
    """The shape a template accepts, by rendering one tool-call turn in each convention.

    ``render(content, arguments)`` renders the probe conversation ending with that turn (raising ``TemplateError``
    when the template refuses it); ``arguments`` is a mapping or its JSON string. ``name_count`` is how often the
    tool's name appears without the turn (the tool list). Returns the shape and what each convention gave.
    """
    object_args: Any = {"query": argument_marker}
    string_args = json.dumps(object_args)
    seen: dict[tuple[bool, bool], str | None] = {}
    notes: list[str] = []
    for content in ("", None):
        for as_string in (False, True):
            try:
                seen[(content is None, as_string)] = render(content, string_args if as_string else object_args)
            except TemplateError as exc:
                seen[(content is None, as_string)] = None
                notes.append(
                    f"content {content!r}, arguments as {'a JSON string' if as_string else 'an object'}: {exc}"
                )

    # Arguments rendered as the JSON a model writes (``"query": "QXARG1"``, any spacing), not escaped inside a
    # string: a template that runs ``tojson`` on a JSON string writes ``"{\\"query\\": ...}"`` (double-encoded),
    # which no model samples. Where some convention renders them faithfully, only such renders count as rendering
    # the arguments; the marker alone tells nothing (it is in the double-encoded text too).
    faithful = re.compile(r'(?<!\\)"query"\s*:\s*"' + re.escape(argument_marker) + '"')
    any_faithful = any(t is not None and faithful.search(t) for t in seen.values())

    def renders(text: str | None) -> str | None:
        if text is None:
            return None
        if argument_marker in text and (not any_faithful or faithful.search(text)):
            return RENDERS_ARGUMENTS
        if argument_marker in text:
            return None  # the arguments, garbled (double-encoded): this convention is not one the template takes
        return RENDERS_NAME if text.count(name_marker) > name_count else RENDERS_NOTHING

    for level in (RENDERS_ARGUMENTS, RENDERS_NAME, RENDERS_NOTHING):
        # Of the content conventions that render this much, the one rendering the least text: a template that
        # renders an empty turn for content "" besides the calls (DeepSeek R1) wants None. Ties keep "".
        candidates = [
            (min(len(t) for t in texts), content_none, texts)
            for content_none in (False, True)
            if (
                texts := [
                    t for (cn, _), t in seen.items() if cn == content_none and t is not None and renders(t) == level
                ]
            )
        ]
        if not candidates:
            continue
        _, content_none, _ = min(candidates, key=lambda c: (c[0], c[1]))
        ok_object = renders(seen[(content_none, False)]) == level
        ok_string = renders(seen[(content_none, True)]) == level
        arguments = ARGUMENTS_EITHER if ok_object and ok_string else ARGUMENTS_OBJECT if ok_object else ARGUMENTS_STRING
        return ToolCallShape(content_none, arguments, level), notes
    raise TemplateError(
        "the template refuses an assistant turn with a tool call in every convention: " + "; ".join(notes)
    )
