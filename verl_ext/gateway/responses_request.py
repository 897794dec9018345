"""An OpenAI Responses API request (``POST /v1/responses``) checked and mapped onto the gateway's chat request, so
that a session served in any shape shares history matching, forks and the check.

The mapping, item by item: ``instructions`` is the first (system) message; an ``input`` string is one user message;
a message item is a message of its role (``developer`` is ``system``; ``input_text`` and ``output_text`` parts
are its text); consecutive ``reasoning``, assistant ``message`` and ``function_call`` items are one assistant turn
(the reasoning text its ``reasoning_content``, the calls its tool calls, ``call_id`` their id), as the gateway
answers a turn; a ``function_call_output`` is the tool message answering its ``call_id``. A function tool is
``{"type": "function", "name", "description", "parameters"}``. The API's server-side state (``previous_response_id``,
``conversation``, item references, stored prompts) is not kept: a harness sends the whole input, as with
``store: false``. An ``input_image`` part (a data URL in ``image_url``) in a message or a ``function_call_output``
is an image part of that message, in order (``verl_ext.gateway.images``; a URL to fetch or a ``file_id`` is
refused). Anything the engine cannot honour (hosted tools, a forced ``tool_choice``, structured output, files,
background runs) is a 400 naming the field; nothing is dropped silently.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_ext.core.messages import json_type
from verl_ext.gateway.errors import bad_request
from verl_ext.gateway.images import image_from_url, image_part, joined
from verl_ext.gateway.request import (
    SEED_RANGE,
    ChatRequest,
    MessageList,
    integer_in,
    number_in,
    refuse_unknown_fields,
    top_k,
)
from verl_ext.gateway.tool_schema import check_description, check_parameters

# Fields whose non-empty value asks for something the gateway does not serve, and why.
_REFUSED = {
    "previous_response_id": "responses are not stored: send the whole conversation as 'input' (as with store: false)",
    "conversation": "conversations are not stored: send the whole conversation as 'input'",
    "prompt": "stored prompt templates are not served: send the instructions and input themselves",
    "background": "background responses are not served: leave 'background' out",
    "max_tool_calls": "the engine samples freely and cannot be held to a number of tool calls: leave it out",
    "top_logprobs": "'top_logprobs' is not served by the gateway's engine: leave it out",
}
# The Responses API's request fields (and the top_k / repetition_penalty / seed extensions engines take): those not
# read here change nothing the engine generates (metadata, store, user, service_tier, safety_identifier,
# prompt_cache_key, prompt_cache_retention, stream_options); any other key is refused, so a misspelt one is never
# ignored (the same rule as chat completions').
KNOWN_FIELDS = frozenset(
    {
        *("input", "instructions", "model", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens"),
        *("temperature", "top_p", "top_k", "seed", "repetition_penalty", "stream", "stream_options", "reasoning"),
        *("text", "truncation", "include", "store", "metadata", "user", "service_tier", "safety_identifier"),
        *("prompt_cache_key", "prompt_cache_retention"),
        *_REFUSED,
    }
)
# Chat completions' and the Messages API's names for Responses fields (a harness moved from either)
_OTHER_APIS_NAMES = {
    "messages": "input",
    "max_tokens": "max_output_tokens",
    "max_completion_tokens": "max_output_tokens",
    "reasoning_effort": "reasoning",
    "thinking": "reasoning",
    "response_format": "text",
    "system": "instructions",
}
_TEXT_KEYS = frozenset({"format", "verbosity"})  # the Responses API's text configuration
_REASONING_KEYS = frozenset({"effort", "summary", "generate_summary"})  # a summary asks for nothing the engine does
# ``include`` values (openai.types.responses.ResponseIncludable) served: the reasoning comes back whole, as a
# reasoning item's reasoning_text content, which the gateway reads back when it is sent again (nothing is encrypted),
# so a stateless client's reasoning round-trips as encrypted_content would carry it.
_INCLUDABLE = frozenset({"reasoning.encrypted_content"})
_NO_HOSTED_TOOLS = "the gateway runs no hosted tools, so there is nothing to include; leave it out"
_NOT_INCLUDED = {
    "message.output_text.logprobs": "logprobs are not served by the gateway's engine; leave it out",
    "message.input_image.image_url": "the input is not stored, so no input image is given back; leave it out",
    **dict.fromkeys(
        (
            *("file_search_call.results", "web_search_call.results", "web_search_call.action.sources"),
            *("computer_call_output.output.image_url", "code_interpreter_call.outputs"),
        ),
        _NO_HOSTED_TOOLS,
    ),
}
# Each served input item type's keys (openai.types.responses.ResponseInputItemParam: an easy input message, an input
# message and an output message for ``message``): an item ``id`` or ``status`` the gateway does not need (nothing
# is stored, and a sent item is the whole item).
_ITEM_KEYS = {
    "message": ("type", "role", "content", "id", "status"),
    "reasoning": ("type", "id", "summary", "content", "encrypted_content", "status"),
    "function_call": ("type", "id", "call_id", "name", "arguments", "status"),
    "function_call_output": ("type", "id", "call_id", "output", "status"),
}
# A function tool's keys (openai.types.responses.FunctionToolParam)
_FUNCTION_TOOL_KEYS = ("type", "name", "description", "parameters", "strict")
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = ("input_text", "output_text", "text")


def parse_responses_request(body: Any) -> ChatRequest:
    """The checked request as the gateway's ``ChatRequest``. Raises ``GatewayError`` (400) naming the field."""
    if not isinstance(body, Mapping):
        raise bad_request(None, f"the request body must be a JSON object, got {json_type(body)}")
    refuse_unknown_fields(body, KNOWN_FIELDS, "Responses", aliases=_OTHER_APIS_NAMES)
    for key, why in _REFUSED.items():
        if body.get(key) not in (None, False, 0):
            raise bad_request(key, f"'{key}' is not served: {why}", "unsupported")
    _check_options(body)
    messages = _instructions(body.get("instructions")) + _input(body.get("input"))
    if messages[-1]["role"] == "assistant":
        raise bad_request(
            "input",
            "the input ends with the assistant's turn: the gateway generates the next assistant turn, so end it with "
            "the user message or function_call_output it answers",
        )
    checked = MessageList(messages)
    max_tokens = integer_in(body, "max_output_tokens", 1, 2**31 - 1)
    return ChatRequest(
        messages=checked,
        tools=_tools(body.get("tools")),
        max_tokens=max_tokens,
        temperature=number_in(body, "temperature", 0.0, 2.0),
        top_p=number_in(body, "top_p", 0.0, 1.0, low_open=True),
        seed=integer_in(body, "seed", *SEED_RANGE),
        stop=(),
        stream=_boolean(body, "stream"),
        include_usage=True,
        model=body.get("model") if isinstance(body.get("model"), str) else None,
        tool_choice=_tool_choice(body.get("tool_choice")),
        top_k=top_k(body),
        repetition_penalty=number_in(body, "repetition_penalty", 0.0, 2.0, low_open=True),
        max_tokens_field="max_output_tokens",
        reasoning_effort=(body.get("reasoning") or {}).get("effort"),  # the template's switch (gateway.thinking)
        reasoning_effort_field="reasoning.effort",
    )


def _check_options(body: Mapping[str, Any]) -> None:
    if body.get("parallel_tool_calls") is False:
        raise bad_request(
            "parallel_tool_calls",
            "'parallel_tool_calls': false is not served: the engine samples freely and may write several calls in "
            "one turn, and every call it wrote is returned; leave it out or set it true",
            "unsupported",
        )
    text = body.get("text")
    if isinstance(text, Mapping):  # its every key read: a verbosity or a misspelt format is never ignored
        refuse_unknown_fields(text, _TEXT_KEYS, "Responses text", "text.")
        if text.get("verbosity") is not None:
            raise bad_request(
                "text.verbosity",
                "'text.verbosity' is not served: the policy writes as it samples, at no verbosity level; leave it out",
                "unsupported",
            )
    if text is not None:
        fmt = text.get("format") if isinstance(text, Mapping) else text
        if fmt is not None and not (isinstance(fmt, Mapping) and fmt.get("type") == "text"):
            raise bad_request(
                "text.format",
                'only the text format is served (no constrained decoding): {"format": {"type": "text"}} or leave '
                "'text' out",
                "unsupported",
            )
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, Mapping):
        raise bad_request(
            "reasoning", f'\'reasoning\' must be an object such as {{"effort": "high"}}, got {json_type(reasoning)}'
        )
    if reasoning is not None:
        refuse_unknown_fields(reasoning, _REASONING_KEYS, "Responses reasoning", "reasoning.")
    truncation = body.get("truncation")
    if truncation not in (None, "disabled"):
        raise bad_request(
            "truncation",
            f"truncation {truncation!r} is not served: the gateway never drops input (a session's tokens are the "
            'trainer\'s); leave it out or use "disabled"',
            "unsupported",
        )
    for key in ("stream", "store"):
        _boolean(body, key)
    _check_include(body.get("include"))


def _check_include(include: Any) -> None:
    """Each ``include`` value is one the gateway serves (``_INCLUDABLE``), else refused with why."""
    if include is None:
        return
    if not isinstance(include, list) or not all(isinstance(i, str) for i in include):
        raise bad_request("include", "'include' must be a list of strings")
    for i, value in enumerate(include):
        if value in _INCLUDABLE:
            continue
        why = _NOT_INCLUDED.get(value)
        if why is None:
            raise bad_request(
                f"include[{i}]",
                f"include[{i}] {value!r} is not a Responses includable; the API's: "
                f"{', '.join(map(repr, sorted([*_INCLUDABLE, *_NOT_INCLUDED])))} (leave it out)",
            )
        raise bad_request(f"include[{i}]", f"include[{i}] {value!r} is not served: {why}", "unsupported")


def _boolean(body: Mapping[str, Any], key: str) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(key, f"'{key}' must be true or false, got {json_type(value)}")
    return value


def _instructions(instructions: Any) -> list[dict[str, Any]]:
    if instructions is None:
        return []
    if not isinstance(instructions, str):
        raise bad_request("instructions", f"'instructions' must be a string, got {json_type(instructions)}")
    return [{"role": "system", "content": instructions}]


def _input(items: Any) -> list[dict[str, Any]]:
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad_request("input", "'input' must be a string or a non-empty list of input items")
    out: list[dict[str, Any]] = []
    turn: dict[str, Any] | None = None  # the assistant turn being gathered from its items
    called: set[str] = set()  # the call ids of the function_call items so far
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise bad_request(where, f"{where} must be an input item (an object), got {json_type(item)}")
        kind = item.get("type", "message")
        _check_item_keys(item, kind, where)
        if kind == "message" or (kind is None and "role" in item):
            message = _message(item, where)
            if message["role"] != "assistant":
                turn = None
                out.append(message)
            elif turn is not None and not turn["content"] and not turn.get("tool_calls"):
                turn["content"] = message["content"]
            else:
                turn = message
                out.append(turn)
        elif kind == "reasoning":
            reasoning = _reasoning(item, where)
            if turn is None or turn["content"] or turn.get("tool_calls") or "reasoning_content" in turn:
                turn = {"role": "assistant", "content": ""}
                out.append(turn)
            turn["reasoning_content"] = reasoning
        elif kind == "function_call":
            if turn is None:
                turn = {"role": "assistant", "content": ""}
                out.append(turn)
            turn.setdefault("tool_calls", []).append(_function_call(item, where))
            called.add(item["call_id"])
        elif kind == "function_call_output":
            turn = None
            out.append(_function_output(item, where))
            if out[-1]["tool_call_id"] not in called:
                raise bad_request(
                    f"{where}.call_id",
                    f"{where}: call_id {out[-1]['tool_call_id']!r} answers no earlier function_call item (call ids so "
                    f"far: {sorted(called)}); use the call_id of the function_call it answers",
                )
        else:
            raise bad_request(
                f"{where}.type",
                f"{where} is a {kind!r} item; served: message, reasoning, function_call and function_call_output "
                "(hosted tools and item references are not): send the items themselves",
                "unsupported",
            )
    return out


def _check_item_keys(item: Mapping[str, Any], kind: Any, where: str) -> None:
    """An item of a served type holds only that type's keys (another type is refused by its type)."""
    if kind is None or (isinstance(kind, str) and kind in _ITEM_KEYS):
        name = kind or "message"
        refuse_unknown_fields(item, _ITEM_KEYS[name], "Responses", f"{where}.", what=f"a Responses {name} item")


def _message(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in _ROLES:
        raise bad_request(f"{where}.role", f"{where}.role must be one of {sorted(_ROLES)}, got {role!r}")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": _ROLES[role], "content": content}
    if not isinstance(content, list):
        raise bad_request(f"{where}.content", f"{where}.content must be a string or a list of parts")
    parts = []
    for k, part in enumerate(content):
        at = f"{where}.content[{k}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append({"type": "text", "text": part["refusal"]})
        elif kind == "input_image" and role != "assistant":
            parts.append(_input_image(part, at))
        elif kind not in _TEXT_PARTS:
            raise bad_request(
                at, f"{at} is a {kind!r} part; only text and input_image parts are served: send those", "unsupported"
            )
        elif not isinstance(part.get("text"), str):
            raise bad_request(f"{at}.text", f"{at}.text must be a string, got {json_type(part.get('text'))}")
        else:
            parts.append({"type": "text", "text": part["text"]})
    return {"role": _ROLES[role], "content": joined(parts)}


def _input_image(part: Mapping[str, Any], at: str) -> dict[str, Any]:
    """An ``input_image`` part's decoded image part (a data URL only: the gateway fetches nothing)."""
    if part.get("file_id") is not None:
        raise bad_request(
            f"{at}.file_id",
            f"{at}: file ids are not served (no file store); send image_url as a data URL",
            "unsupported",
        )
    if part.get("image_url") is None:
        raise bad_request(at, f"{at}: an input_image part needs 'image_url' (a data URL)")
    return image_part(image_from_url(part.get("image_url"), f"{at}.image_url"))


def _reasoning(item: Mapping[str, Any], where: str) -> str:
    """The reasoning text of a reasoning item: its ``content`` (reasoning_text parts), else its summary's text."""
    if item.get("encrypted_content") is not None:  # the gateway gives none: this one was encrypted elsewhere
        raise bad_request(
            f"{where}.encrypted_content",
            f"{where}: encrypted reasoning cannot be read by the gateway (it encrypts none); send the reasoning as "
            "the item's reasoning_text content, as the gateway gave it",
            "unsupported",
        )
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        if parts in (None, []):
            continue
        if not isinstance(parts, list) or not all(
            isinstance(p, Mapping) and p.get("type") == kind and isinstance(p.get("text"), str) for p in parts
        ):
            raise bad_request(f"{where}.{key}", f"{where}.{key} must be a list of {kind} parts with a string 'text'")
        return "".join(p["text"] for p in parts)
    return ""


def _function_call(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    for key in ("call_id", "name", "arguments"):
        if not isinstance(item.get(key), str) or (key != "arguments" and not item[key]):
            raise bad_request(f"{where}.{key}", f"{where}: a function_call needs its '{key}' (a string)")
    return {
        "id": item["call_id"],
        "type": "function",
        "function": {"name": item["name"], "arguments": item["arguments"]},
    }


def _function_output(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(item.get("call_id"), str) or not item["call_id"]:
        raise bad_request(f"{where}.call_id", f"{where}: a function_call_output needs the 'call_id' it answers")
    output = item.get("output")
    if isinstance(output, list):
        parts = []
        for k, part in enumerate(output):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind == "input_image":
                parts.append(_input_image(part, f"{where}.output[{k}]"))
            elif kind in _TEXT_PARTS and isinstance(part.get("text"), str):
                parts.append({"type": "text", "text": part["text"]})
            else:
                raise bad_request(
                    f"{where}.output[{k}]",
                    f"{where}.output[{k}]: only text and input_image parts are served",
                    "unsupported",
                )
        output = joined(parts)
    if not isinstance(output, str | list):
        raise bad_request(f"{where}.output", f"{where}.output must be a string, got {json_type(output)}")
    return {"role": "tool", "tool_call_id": item["call_id"], "content": output}


def _tools(tools: Any) -> tuple[dict[str, Any], ...] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_request("tools", f"'tools' must be a list of function tools, got {json_type(tools)}")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise bad_request(where, f"{where} must be a function tool object, got {json_type(tool)}")
        if tool.get("type") != "function":
            raise bad_request(
                f"{where}.type",
                f"{where} is a {tool.get('type')!r} tool; only function tools are served (the client runs them): "
                'declare it as {"type": "function", "name": ..., "parameters": ...} and run it yourself',
                "unsupported",
            )
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            nested = isinstance(tool.get("function"), Mapping)  # chat completions' shape
            hint = " (a Responses function tool is flat: move the 'function' object's keys up)" if nested else ""
            raise bad_request(f"{where}.name", f"{where}: 'name' must be a non-empty string{hint}")
        refuse_unknown_fields(tool, _FUNCTION_TOOL_KEYS, "Responses", f"{where}.", what="a Responses function tool")
        parameters = tool.get("parameters")
        if parameters is not None:
            check_parameters(parameters, f"{where}.parameters")
        check_description(tool.get("description"), f"{where}.description")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": function})
    return tuple(out) or None


def _tool_choice(choice: Any) -> str:
    if choice is None or choice in ("auto", "none"):
        return choice or "auto"
    raise bad_request(
        "tool_choice",
        f"tool_choice {choice!r} is not served: the engine samples freely and cannot be forced to call a tool; "
        'use "auto" (or "none")',
        "unsupported",
    )
