"""An Anthropic Messages API request (``POST /v1/messages``) checked and mapped onto the gateway's chat request, so
that a session served in either shape shares history matching, forks and the check.

The mapping, block by block: ``system`` (text or text blocks) is the first message; a user message's
``tool_result`` blocks are tool messages (``tool_use_id`` is their ``tool_call_id``) followed by its text, if any,
as a user message; an assistant message's text blocks are its content, its ``tool_use`` blocks its tool calls
(``input`` as the arguments) and its ``thinking`` block its ``reasoning_content``; a tool's ``input_schema`` is its
function's parameters. Prompt-caching hints (``cache_control``) change no token and are accepted; ``is_error`` on
a tool result is accepted too (the chat template renders a tool result as its text). An ``image`` block (a base64
``source``) in a user message or a tool result is an image part of that message, in block order
(``verl_ext.gateway.images``; a ``url`` or ``file`` source is refused: the gateway fetches nothing). Anything the
engine cannot honour (documents, server tools, a forced ``tool_choice``, prefill, ``thinking`` other than the
template renders: ``read_thinking``) is a 400 naming the field and the fix; nothing is dropped silently, and what is
served otherwise than asked (an extended-thinking budget) is said in the answer.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from verl_ext.core.messages import json_type
from verl_ext.gateway.errors import GatewayError, bad_request
from verl_ext.gateway.images import decode_image, image_part, joined
from verl_ext.gateway.request import ChatRequest, number_in, refuse_unknown_fields, top_k
from verl_ext.gateway.thinking import REASONING_ON
from verl_ext.gateway.tool_schema import check_description, check_parameters

# Fields whose presence asks for something the engine cannot do (value None or absent is fine).
_REFUSED = {
    "mcp_servers": "MCP servers are run by the client here: the gateway serves the model only; leave it out",
    "container": "containers (server-side code execution) are not served; leave 'container' out",
    "output_config": "structured output and effort settings are not served (the engine samples freely, and the chat "
    "template decides the reasoning: see 'thinking'); leave 'output_config' out",
}
# The Messages API's request fields: those not read here change no token (metadata, service_tier, cache_control,
# inference_geo, speed, workspace_id, user_profile_id, diagnostics); any other key is refused, so a misspelt one is
# never ignored (the same rule as chat completions').
KNOWN_FIELDS = frozenset(
    {
        *("model", "messages", "system", "max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "stream"),
        *("tools", "tool_choice", "thinking", "output_config", "metadata", "service_tier", "cache_control"),
        *("inference_geo", "speed", "workspace_id", "user_profile_id", "diagnostics"),
        *_REFUSED,
    }
)
# The OpenAI APIs' names for Messages API fields (a harness moved from chat completions or Responses)
_OTHER_APIS_NAMES = {
    "stop": "stop_sequences",
    "max_completion_tokens": "max_tokens",
    "max_output_tokens": "max_tokens",
    "reasoning_effort": "thinking",
    "reasoning": "thinking",
    "input": "messages",
    "instructions": "system",
}
# A custom tool's keys (anthropic.types.ToolParam): cache_control changes no token; eager_input_streaming asks how a
# streamed tool input is chunked, and the gateway streams a turn once it is sampled, each tool input in one delta.
_TOOL_KEYS = (
    *("type", "name", "description", "input_schema", "cache_control", "strict", "eager_input_streaming"),
    *("defer_loading", "allowed_callers", "input_examples"),
)
# Each tool_choice type's keys (anthropic.types.ToolChoiceParam), ``type`` included.
_TOOL_CHOICE_KEYS = {
    "auto": ("type", "disable_parallel_tool_use"),
    "any": ("type", "disable_parallel_tool_use"),
    "tool": ("type", "name", "disable_parallel_tool_use"),
    "none": ("type",),
}
_TEXT_ONLY = "only text, tool_use, tool_result and thinking blocks are served"
_USER_BLOCKS = "only text, image and tool_result blocks are served"


def parse_messages_request(body: Any) -> ChatRequest:
    """The checked request as the gateway's ``ChatRequest``. Raises ``GatewayError`` (400) naming the field."""
    if not isinstance(body, Mapping):
        raise bad_request(None, f"the request body must be a JSON object, got {json_type(body)}")
    refuse_unknown_fields(body, KNOWN_FIELDS, "Messages API", aliases=_OTHER_APIS_NAMES)
    for key, why in _REFUSED.items():
        if body.get(key) not in (None, {}):
            raise bad_request(key, why, "unsupported")
    if "max_tokens" not in body:  # required by Anthropic's API: the SDK's own error says so too
        raise bad_request("max_tokens", "'max_tokens' is required (the Messages API has no default): send e.g. 1024")
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens < 2**31:
        raise bad_request("max_tokens", f"'max_tokens' must be an integer from 1 to 2**31-1, got {max_tokens!r}")
    thinking = read_thinking(body.get("thinking"), max_tokens)
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise bad_request("messages", "'messages' must be a non-empty list of user and assistant messages")
    messages = _system(body.get("system"))
    for i, message in enumerate(raw):
        messages += _message(message, i)
    if raw[-1].get("role") == "assistant":
        raise bad_request(
            f"messages[{len(raw) - 1}]",
            f"messages[{len(raw) - 1}] is an assistant message: prefill (continuing a partial assistant turn) is "
            "not served, since the chat template closes every assistant turn; end the list with the user message "
            "it answers",
        )
    _check_tool_results(raw)
    return ChatRequest(
        messages=tuple(messages),
        tools=_tools(body.get("tools")),
        max_tokens=max_tokens,
        temperature=number_in(body, "temperature", 0.0, 1.0),
        top_p=number_in(body, "top_p", 0.0, 1.0, low_open=True),
        seed=None,
        stop=_stop_sequences(body.get("stop_sequences")),
        stream=_stream(body.get("stream")),
        include_usage=False,
        model=body.get("model") if isinstance(body.get("model"), str) else None,
        tool_choice=_tool_choice(body.get("tool_choice")),
        top_k=top_k(body),
        reasoning_effort=thinking.effort,
        reasoning_effort_field="thinking",
        reasoning_effort_sent=thinking.sent,
        overridden=thinking.overridden,
    )


# Anthropic's thinking configurations and the keys each takes (``type`` included).
_THINKING_KEYS = {
    "enabled": ("type", "budget_tokens", "display"),
    "adaptive": ("type", "display"),
    "disabled": ("type",),
}


@dataclass(frozen=True)
class Thinking:
    """A request's ``thinking``, read: the effort checked against the template's thinking switch (``REASONING_ON``
    for ``enabled`` / ``adaptive``, "none" for ``disabled``), what was sent (named in a refusal) and what the gateway
    serves otherwise than asked (said in the answer's ``verl_ext.sampling_overridden``)."""

    effort: str | None = None
    sent: Mapping[str, Any] | None = None
    overridden: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def read_thinking(thinking: Any, max_tokens: int) -> Thinking:
    """``thinking`` checked key by key (verl_ext.gateway.thinking maps its effort onto the template's switch).

    ``enabled`` and ``adaptive`` ask for reasoning, served where the gateway renders thinking on; ``disabled`` asks
    for none. ``budget_tokens`` is checked as Anthropic checks it (an integer below ``max_tokens``) but cannot be
    honoured: the engine samples the reasoning as the template opens it, bounded by ``max_tokens`` only, so it is
    served and said (``thinking.budget_tokens`` requested N, used null). ``display: "omitted"`` is refused: the
    sampled reasoning comes back as a thinking block, unredacted. Any other key or type is refused."""
    if thinking is None:
        return Thinking()
    if not isinstance(thinking, Mapping):
        raise bad_request(
            "thinking",
            f'\'thinking\' must be an object such as {{"type": "enabled", "budget_tokens": 1024}}, got '
            f"{json_type(thinking)}",
        )
    kind = thinking.get("type")
    if not isinstance(kind, str) or kind not in _THINKING_KEYS:
        raise bad_request(
            "thinking.type",
            f"'thinking.type' {kind!r} is not served: send 'enabled' (with 'budget_tokens'), 'adaptive' or "
            "'disabled' (whether the policy reasons is its chat template's switch), or leave 'thinking' out",
            "unsupported" if isinstance(kind, str) else "invalid_value",
        )
    refuse_unknown_fields(
        thinking, _THINKING_KEYS[kind], "Messages API", "thinking.", what=f"a {kind!r} thinking configuration"
    )
    display = thinking.get("display")
    if display not in (None, "summarized"):
        raise bad_request(
            "thinking.display",
            f"'thinking.display' {display!r} is not served: the sampled reasoning comes back as a thinking block, as "
            "sampled (nothing is redacted or signed); send 'summarized' or leave it out",
            "unsupported",
        )
    if kind == "disabled":
        return Thinking("none", dict(thinking))
    overridden: dict[str, dict[str, Any]] = {}
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        if isinstance(budget, bool) or not isinstance(budget, int) or not 1 <= budget < max_tokens:
            raise bad_request(
                "thinking.budget_tokens",
                f"'thinking.budget_tokens' must be an integer from 1 to max_tokens - 1 ({max_tokens - 1}), got "
                f"{json.dumps(budget)}: thinking tokens count toward 'max_tokens', as on Anthropic's API",
            )
        overridden["thinking.budget_tokens"] = {"requested": budget, "used": None}  # bounded by max_tokens only
    return Thinking(REASONING_ON, dict(thinking), overridden)


def _system(system: Any) -> list[dict[str, Any]]:
    if system is None:
        return []
    text = _text(system, "system")
    return [{"role": "system", "content": text}]


def _text(content: Any, where: str) -> str:
    """A string, or the text of a list of text blocks (joined)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(where, f"{where} must be a string or a list of text blocks, got {json_type(content)}")
    parts = []
    for k, block in enumerate(content):
        if not isinstance(block, Mapping) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, Mapping) else json_type(block)
            raise bad_request(f"{where}[{k}]", f"{where}[{k}] is a {kind!r} block; only text blocks are served here")
        parts.append(block["text"])
    return "".join(parts)


def _blocks(message: Mapping[str, Any], where: str) -> list[Mapping[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise bad_request(f"{where}.content", f"{where}.content must be a string or a list of content blocks")
    for k, block in enumerate(content):
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            raise bad_request(f"{where}.content[{k}]", f"{where}.content[{k}] must be a content block with a 'type'")
    return content


def _message(message: Any, index: int) -> list[dict[str, Any]]:
    """One Messages API message as the gateway's messages (a user message may become several)."""
    where = f"messages[{index}]"
    if not isinstance(message, Mapping):
        raise bad_request(where, f"{where} must be an object with 'role' and 'content', got {json_type(message)}")
    refuse_unknown_fields(message, ("role", "content"), "Messages API", f"{where}.", what="a Messages API message")
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise bad_request(f"{where}.role", f"{where}.role must be 'user' or 'assistant', got {role!r}")
    blocks = _blocks(message, where)
    return _user(blocks, where) if role == "user" else [_assistant(blocks, where)]


def _user(blocks: list[Mapping[str, Any]], where: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for k, block in enumerate(blocks):
        at = f"{where}.content[{k}]"
        kind = block["type"]
        if kind == "tool_result":
            if parts:
                raise bad_request(
                    at, f"{at}: tool_result blocks must come before any text in a user message (the API's rule)"
                )
            if not isinstance(block.get("tool_use_id"), str) or not block["tool_use_id"]:
                raise bad_request(f"{at}.tool_use_id", f"{at}: a tool_result needs the 'tool_use_id' it answers")
            content = block.get("content")
            result = "" if content is None else _result_content(content, f"{at}.content")
            out.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": result})
        elif kind == "text":
            parts.append({"type": "text", "text": _block_text(block, at)})
        elif kind == "image":
            parts.append(_image(block, at))
        else:
            raise bad_request(at, f"{at} is a {kind!r} block in a user message; {_USER_BLOCKS}: send those")
    if parts or not out:
        out.append({"role": "user", "content": joined(parts)})
    return out


def _result_content(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A tool_result's content: a string, or text and image blocks (an image part each, in order)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(
            where, f"{where} must be a string or a list of text and image blocks, got {json_type(content)}"
        )
    parts: list[dict[str, Any]] = []
    for k, block in enumerate(content):
        kind = block.get("type") if isinstance(block, Mapping) else json_type(block)
        if kind == "text":
            parts.append({"type": "text", "text": _block_text(block, f"{where}[{k}]")})
        elif kind == "image":
            parts.append(_image(block, f"{where}[{k}]"))
        else:
            raise bad_request(
                f"{where}[{k}]", f"{where}[{k}] is a {kind!r} block; only text and image blocks are served"
            )
    return joined(parts)


def _image(block: Mapping[str, Any], at: str) -> dict[str, Any]:
    """An image block's decoded image part (base64 sources only: the gateway fetches nothing)."""
    source = block.get("source")
    if not isinstance(source, Mapping):
        raise bad_request(f"{at}.source", f"{at}: an image block needs a 'source' object")
    if source.get("type") != "base64":
        raise bad_request(
            f"{at}.source.type",
            f"{at}: an image source of type {source.get('type')!r} is not served: the gateway fetches no images (no "
            'network policy); send {"type": "base64", "media_type": "image/png", "data": ...}',
            "unsupported",
        )
    return image_part(decode_image(source.get("media_type"), source.get("data"), f"{at}.source"))


def _assistant(blocks: list[Mapping[str, Any]], where: str) -> dict[str, Any]:
    texts: list[str] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for k, block in enumerate(blocks):
        at = f"{where}.content[{k}]"
        kind = block["type"]
        if kind == "text":
            texts.append(_block_text(block, at))
        elif kind == "thinking":
            if not isinstance(block.get("thinking"), str):
                raise bad_request(f"{at}.thinking", f"{at}: a thinking block's 'thinking' must be a string")
            reasoning.append(block["thinking"])
        elif kind == "tool_use":
            calls.append(_tool_use(block, at))
        else:
            raise bad_request(at, f"{at} is a {kind!r} block in an assistant message; {_TEXT_ONLY}")
    out: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        out["reasoning_content"] = "".join(reasoning)
    if calls:
        out["tool_calls"] = calls
    return out


def _block_text(block: Mapping[str, Any], at: str) -> str:
    if not isinstance(block.get("text"), str):
        raise bad_request(f"{at}.text", f"{at}: a text block's 'text' must be a string")
    return block["text"]


def _tool_use(block: Mapping[str, Any], at: str) -> dict[str, Any]:
    for key in ("id", "name"):
        if not isinstance(block.get(key), str) or not block[key]:
            raise bad_request(f"{at}.{key}", f"{at}: a tool_use block needs its '{key}' (a non-empty string)")
    if "input" not in block:
        raise bad_request(f"{at}.input", f"{at}: a tool_use block needs its 'input'")
    arguments = json.dumps(block["input"], ensure_ascii=False)
    return {"id": block["id"], "type": "function", "function": {"name": block["name"], "arguments": arguments}}


def _check_tool_results(messages: list[Any]) -> None:
    """Every tool_result answers a tool_use of an earlier assistant message."""
    known: set[str] = set()
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for k, block in enumerate(content):
            if message["role"] == "assistant" and block["type"] == "tool_use":
                known.add(block["id"])
            elif block["type"] == "tool_result" and block["tool_use_id"] not in known:
                raise bad_request(
                    f"messages[{i}].content[{k}].tool_use_id",
                    f"messages[{i}].content[{k}]: tool_use_id {block['tool_use_id']!r} answers no tool_use block of "
                    f"an earlier assistant message (tool_use ids so far: {sorted(known)}); use the id of the tool_use "
                    "block it answers",
                )


def _tools(tools: Any) -> tuple[dict[str, Any], ...] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_request("tools", f"'tools' must be a list of tools, got {json_type(tools)}")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise bad_request(where, f"{where} must be an object with 'name' and 'input_schema'")
        if tool.get("type") not in (None, "custom"):
            raise bad_request(
                f"{where}.type",
                f"{where} is a server tool ({tool.get('type')!r}); the gateway serves the model only: declare the "
                "tool with 'name', 'description' and 'input_schema' and run it in the client",
                "unsupported",
            )
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise bad_request(f"{where}.name", f"{where}: 'name' must be a non-empty string")
        schema = tool.get("input_schema")
        check_parameters(schema, f"{where}.input_schema")
        description = tool.get("description")
        check_description(description, f"{where}.description")
        _check_tool_options(tool, where)
        function: dict[str, Any] = {"name": tool["name"]}
        if description is not None:
            function["description"] = description
        function["parameters"] = dict(schema)
        if tool.get("strict") is not None:  # passed to the template as on the OpenAI routes (no constrained decoding)
            function["strict"] = tool["strict"]
        out.append({"type": "function", "function": function})
    return tuple(out) or None


def _check_tool_options(tool: Mapping[str, Any], where: str) -> None:
    """A custom tool's keys (``anthropic.types.ToolParam``): what asks for a feature the gateway has not (tool
    search, programmatic calls from code execution, input examples the template would not render) is refused."""
    refuse_unknown_fields(tool, _TOOL_KEYS, "Messages API", f"{where}.", what="a Messages API custom tool")
    if tool.get("defer_loading"):
        raise bad_request(
            f"{where}.defer_loading",
            f"{where}: 'defer_loading' is not served: the gateway runs no tool search, every tool is in the prompt; "
            "leave it out",
            "unsupported",
        )
    if tool.get("allowed_callers") not in (None, ["direct"]):
        raise bad_request(
            f"{where}.allowed_callers",
            f"{where}: 'allowed_callers' {tool['allowed_callers']!r} is not served: the gateway runs no code "
            'execution, the model calls tools directly; send ["direct"] or leave it out',
            "unsupported",
        )
    if tool.get("input_examples") not in (None, []):
        raise bad_request(
            f"{where}.input_examples",
            f"{where}: 'input_examples' are not served: the chat template renders a tool's name, description and "
            "schema only; write the examples into the description, or leave 'input_examples' out",
            "unsupported",
        )


def _tool_choice(choice: Any) -> str:
    if choice is None:
        return "auto"
    kind = choice.get("type") if isinstance(choice, Mapping) else None
    if isinstance(kind, str) and kind in _TOOL_CHOICE_KEYS:
        what = f"a tool_choice of type {kind!r}"
        refuse_unknown_fields(choice, _TOOL_CHOICE_KEYS[kind], "Messages API", "tool_choice.", what=what)
    if kind in ("auto", "none"):
        if choice.get("disable_parallel_tool_use"):
            raise bad_request(
                "tool_choice.disable_parallel_tool_use",
                "'disable_parallel_tool_use' is not served: the engine samples freely and cannot be held to one "
                "tool call; leave it out",
                "unsupported",
            )
        return str(kind)
    raise bad_request(
        "tool_choice",
        f"tool_choice {choice!r} is not served: the engine samples freely and cannot be forced to call a tool; "
        'use {"type": "auto"} (or {"type": "none"})',
        "unsupported",
    )


def _stop_sequences(stops: Any) -> tuple[str, ...]:
    if stops is None:
        return ()
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise bad_request("stop_sequences", "'stop_sequences' must be a list of non-empty strings")
    return tuple(stops)


def _stream(stream: Any) -> bool:
    if stream is None:
        return False
    if not isinstance(stream, bool):
        raise bad_request("stream", f"'stream' must be true or false, got {json_type(stream)}")
    return stream


def stop_sequences_error(exc: GatewayError) -> GatewayError:
    """The gateway's error for a ``stop`` string, named as the Messages API names the field."""
    if exc.param != "stop":
        return exc
    message = exc.message.replace("stop ", "stop_sequences entry ", 1)
    return GatewayError(exc.status, message, type=exc.type, param="stop_sequences", code=exc.code)
