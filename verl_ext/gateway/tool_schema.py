"""Tool definitions as the OpenAI and Anthropic APIs accept them, checked when a request is read, and the view of
them verl's tool parsers take.

The APIs accept any JSON Schema object as a function's parameters: no ``description``, ``"description": null``,
no ``properties``, optional arguments (``anyOf`` with ``{"type": "null"}``, as pydantic writes ``Optional[...]``),
nested ones (``$ref`` into ``$defs``), ``true`` as a property's schema. verl's ``OpenAIFunctionToolSchema`` is
narrower (a string description, ``properties`` required, each with a ``type``), and its parsers read only the
names, each property's type and ``required``. So a request's tools are checked here against what the APIs accept
(a 400 naming the field, before any engine call), rendered by the chat template as sent, and handed to the parser
as ``parser_view`` writes them: the same names, types and required lists, in the shape verl validates.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_ext.core.messages import json_type
from verl_ext.gateway.errors import bad_request

_JSON_TYPES = ("string", "number", "integer", "boolean", "object", "array", "null")


def check_parameters(parameters: Any, where: str) -> None:
    """Raise a 400 naming ``where`` unless ``parameters`` is a JSON Schema object the APIs accept: an object whose
    ``type`` (if given) is ``"object"``, whose ``properties`` (if given) map names to schemas (objects or booleans)
    and whose ``required`` (if given) is a list of strings."""
    if not isinstance(parameters, Mapping) or parameters.get("type", "object") != "object":
        got = json_type(parameters) if not isinstance(parameters, Mapping) else f"type {parameters.get('type')!r}"
        raise bad_request(
            where, f'{where}: must be a JSON Schema object ({{"type": "object", "properties": ...}}), got {got}'
        )
    properties = parameters.get("properties")
    if properties is not None:
        if not isinstance(properties, Mapping):
            raise bad_request(
                f"{where}.properties", f"{where}.properties must be an object, got {json_type(properties)}"
            )
        for name, schema in properties.items():
            if not isinstance(schema, Mapping | bool):
                raise bad_request(
                    f"{where}.properties.{name}",
                    f"{where}.properties.{name} must be a JSON Schema (an object), got {json_type(schema)}",
                )
    required = parameters.get("required")
    if required is not None and (not isinstance(required, list) or not all(isinstance(r, str) for r in required)):
        raise bad_request(f"{where}.required", f"{where}.required must be a list of property names")


def check_description(description: Any, where: str) -> None:
    """A description is optional: a string or null."""
    if description is not None and not isinstance(description, str):
        raise bad_request(where, f"{where} must be a string (or left out), got {json_type(description)}")


def parser_view(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A checked ``{"type": "function", "function": {...}}`` tool in the shape verl's ``OpenAIFunctionToolSchema``
    validates: description a string, ``properties`` present, each property a ``type`` (read from ``anyOf`` /
    ``oneOf`` branches where the schema has none; ``object`` for a ``$ref``; else ``string``, as verl's parsers
    treat an untyped argument)."""
    function = tool["function"]
    parameters = function.get("parameters") or {}
    properties = parameters.get("properties") or {}
    return {
        "type": "function",
        "function": {
            "name": function["name"],
            "description": function.get("description") or "",
            "parameters": {
                "type": "object",
                "properties": {name: _property(schema) for name, schema in properties.items()},
                "required": list(parameters.get("required") or []),
            },
        },
    }


def _property(schema: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": _types(schema)}
    if isinstance(schema, Mapping):
        if isinstance(schema.get("description"), str):
            out["description"] = schema["description"]
        if isinstance(schema.get("enum"), list):
            out["enum"] = schema["enum"]
    return out


def _types(schema: Any) -> str | list[str]:
    if not isinstance(schema, Mapping):
        return "string"
    kind = schema.get("type")
    if isinstance(kind, str):
        return kind
    if isinstance(kind, list) and kind and all(isinstance(k, str) for k in kind):
        return list(kind)
    found: list[str] = []
    for key in ("anyOf", "oneOf", "allOf"):
        for branch in schema.get(key) or ():
            for k in _flat(_types(branch)):
                if k not in found:
                    found.append(k)
    if found:
        return found[0] if len(found) == 1 else found
    if "$ref" in schema or "properties" in schema:
        return "object"
    if "items" in schema:
        return "array"
    return "string"


def _flat(kind: str | list[str]) -> list[str]:
    return [kind] if isinstance(kind, str) else kind
