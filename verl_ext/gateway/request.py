"""A chat-completions request body, checked field by field: every problem is a 400 naming the field.

What the gateway serves is the OpenAI chat-completions shape with one choice (``n`` = 1). Messages come out
normalized: ``content`` is text (text parts joined; null is ""), or, where it holds images (``image_url`` parts
with data URLs, in any message but an assistant's), its parts in order with each image decoded
(``verl_ext.gateway.images``); ``developer`` is ``system``, an assistant's
``reasoning`` is ``reasoning_content``. Nothing a request asks for is silently ignored: a field the engine cannot
honour (``n`` > 1, ``logprobs``, penalties, a forced ``tool_choice``, ``parallel_tool_calls: false``) is refused
with the reason.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from verl_ext.core.messages import json_type, message_problem
from verl_ext.core.turn_parse import call_id
from verl_ext.gateway.errors import GatewayError, bad_request
from verl_ext.gateway.images import image_from_url, image_part, is_decoded_image_part, joined
from verl_ext.gateway.tool_schema import check_description, check_parameters

ROLES = ("system", "user", "assistant", "tool")
_ROLE_ALIASES = {"developer": "system"}
# Fields whose non-default value changes sampling in a way the engine cannot honour.
_REFUSED_IF_SET = {
    "logprobs": (False, None),
    "top_logprobs": (None, 0),
    "logit_bias": (None, {}),
    "min_p": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
}
# Output the engine cannot produce (audio, predicted outputs): refused when set to anything but these values.
_REFUSED_OUTPUTS = {
    "modalities": (None, ["text"]),
    "audio": (None,),
    "prediction": (None,),
}
# Fields that change what is generated in a way the engine or the template does not serve, and why.
_REFUSED_FIELDS = {
    "verbosity": "the policy writes as it samples, at no verbosity level; leave it out",
    "web_search_options": "the gateway runs no hosted tools (declare a function tool and run the search yourself); "
    "leave it out",
}
# Every field the chat-completions API (and the top_k / repetition_penalty / min_p extensions engines take) defines:
# those not read above or below change nothing the engine generates (metadata, store, user, service_tier,
# safety_identifier, prompt_cache_key); any other key is refused, so that a misspelt option is never ignored.
KNOWN_FIELDS = frozenset(
    {
        *("messages", "model", "tools", "tool_choice", "functions", "function_call", "parallel_tool_calls"),
        *("max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "stop", "n"),
        *("stream", "stream_options", "response_format", "repetition_penalty"),
        "reasoning_effort",  # the template's thinking switch, where it has one (verl_ext.gateway.thinking)
        *_REFUSED_IF_SET,
        *_REFUSED_OUTPUTS,
        *_REFUSED_FIELDS,
        *("metadata", "store", "user", "service_tier", "safety_identifier", "prompt_cache_key"),
    }
)
# Other APIs' names for chat-completions fields (a harness moved from the Responses or Messages API)
_OTHER_APIS_NAMES = {
    "input": "messages",
    "max_output_tokens": "max_tokens",
    "stop_sequences": "stop",
    "reasoning": "reasoning_effort",
    "thinking": "reasoning_effort",
}
_STREAM_OPTIONS = ("include_usage", "include_obfuscation")
# Each role's message keys (openai.types.chat.ChatCompletionMessageParam), and the assistant's reasoning as SGLang's
# and vLLM's servers answer it (``reasoning_content``, or ``reasoning``); a tool message's ``name`` is rendered as a
# user's is (agent frameworks send it). An assistant's ``audio`` and ``refusal`` are refused when set: the engine
# writes neither.
_MESSAGE_KEYS = {
    "system": ("role", "content", "name"),
    "developer": ("role", "content", "name"),
    "user": ("role", "content", "name"),
    "assistant": (
        *("role", "content", "name", "tool_calls", "function_call", "refusal", "audio"),
        *("reasoning_content", "reasoning"),
    ),
    "tool": ("role", "content", "tool_call_id", "name"),
    "function": ("role", "content", "name"),
}
SEED_RANGE = (-(2**63), 2**63 - 1)  # a 64-bit signed integer, as the API's seed is (torch's generator takes it)


class MessageList(Sequence[dict[str, Any]]):
    """A request's messages: the list as sent (``raw``), each message checked and normalized when it is first read
    (a 400 naming it when it is malformed). A session reads only what it does not hold already: a message equal to
    one it was sent before is known to be well formed, so a request's cost is reading it, not checking its history
    again. ``check_all`` reads every message in order (the first bad one is named)."""

    __slots__ = ("_read", "raw")

    def __init__(self, raw: list[Any]) -> None:
        self.raw = raw
        self._read: list[dict[str, Any] | None] = [None] * len(raw)

    def __len__(self) -> int:
        return len(self.raw)

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self.raw)))]
        i = index + len(self.raw) if index < 0 else index
        if not 0 <= i < len(self.raw):
            raise IndexError(f"message index {index} out of range for {len(self.raw)} messages")
        message = self._read[i]
        if message is None:
            message = _message(self._legacy(i), i)
            if message["role"] == "tool":
                self._check_reply(i, message["tool_call_id"])
            self._read[i] = message
        return message

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for i in range(len(self.raw)):
            yield self[i]

    @property
    def read(self) -> int:
        """How many messages have been read (checked and normalized) so far."""
        return len(self._read) - self._read.count(None)

    def check_all(self) -> None:
        """Read every message, in order: raises for the first malformed one."""
        for _ in self:
            pass

    def _legacy(self, i: int) -> Any:
        """Message ``i`` with the legacy function-calling fields as tool calls: an assistant ``function_call`` is a
        tool call of the id the gateway gives a turn's first call, a ``function`` message the tool message
        answering the nearest earlier one (the legacy API has no call ids)."""
        raw = self.raw[i]
        if not isinstance(raw, Mapping):
            return raw
        if raw.get("role") == "assistant" and raw.get("function_call") is not None and "tool_calls" not in raw:
            turn = sum(1 for m in self.raw[:i] if isinstance(m, Mapping) and m.get("role") == "assistant")
            return {
                **raw,
                "tool_calls": [{"id": call_id(turn, 0), "type": "function", "function": raw["function_call"]}],
            }
        if raw.get("role") == "function":
            for j in range(i - 1, -1, -1):
                earlier = self._legacy(j)
                if isinstance(earlier, Mapping) and earlier.get("role") == "assistant" and earlier.get("tool_calls"):
                    call = earlier["tool_calls"][0]
                    return {
                        "role": "tool",
                        "tool_call_id": call["id"] if isinstance(call, Mapping) else None,
                        "content": raw.get("content"),
                        "name": raw.get("name"),
                    }
            where = f"messages[{i}]"
            raise bad_request(
                where,
                f"{where}: a 'function' message answers no earlier assistant function_call; send the assistant "
                "message with its function_call before it",
            )
        return raw

    def _check_reply(self, index: int, call_id: str) -> None:
        """A tool message answers a call of an earlier assistant message (the nearest is looked at first: tool
        messages follow the turn they answer)."""
        for j in range(index - 1, -1, -1):
            raw = self.raw[j]
            is_assistant = isinstance(raw, Mapping) and raw.get("role") == "assistant"
            if is_assistant and any(c["id"] == call_id for c in self[j].get("tool_calls") or ()):
                return
        known = sorted(c["id"] for m in self[:index] if m["role"] == "assistant" for c in m.get("tool_calls") or ())
        raise bad_request(
            f"messages[{index}].tool_call_id",
            f"messages[{index}]: tool_call_id {call_id!r} answers no tool call of an earlier assistant message "
            f"(calls so far: {known}); use the id of the call it answers",
        )


@dataclass(frozen=True)
class ChatRequest:
    """One checked chat-completions request (messages normalized as the module says; a ``MessageList`` checks each
    message when it is read)."""

    messages: Sequence[dict[str, Any]]
    tools: tuple[dict[str, Any], ...] | None
    max_tokens: int | None
    temperature: float | None
    top_p: float | None
    seed: int | None
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    model: str | None
    tool_choice: str
    top_k: int | None = None  # None: the engine's default (no top-k cut)
    repetition_penalty: float | None = None  # None: 1.0
    legacy_functions: bool = False  # the request used ``functions``: the answer carries ``function_call``
    max_tokens_field: str = "max_tokens"  # the field that gave ``max_tokens``, named when it does not fit
    # the reasoning the request asks for ("none" ... "high"), checked against the template's thinking switch
    # (verl_ext.gateway.thinking) by the gateway, which renders; None: not asked
    reasoning_effort: object = None
    reasoning_effort_field: str = "reasoning_effort"  # the field that asked it, named in a refusal
    reasoning_effort_sent: object = None  # what that field said, where not the effort itself (Anthropic's thinking)
    # what the request asked that the gateway serves otherwise (Anthropic's thinking.budget_tokens), as
    # ``Completion.sampling_overridden`` says it: setting -> {"requested", "used"}
    overridden: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


def parse_chat_request(body: Any) -> ChatRequest:
    """The checked request. Raises ``GatewayError`` (400) naming the first bad field and the fix; a message is
    checked when it is read (``MessageList``), and the gateway reads every message it does not hold already."""
    if not isinstance(body, Mapping):
        raise bad_request(None, f"the request body must be a JSON object, got {json_type(body)}")
    _refuse_unsupported(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages", "'messages' must be a non-empty list of chat messages")
    normalized = MessageList(messages)
    if normalized[-1]["role"] == "assistant":
        raise bad_request(
            f"messages[{len(normalized) - 1}]",
            "the last message is an assistant message: the gateway generates the next assistant turn, so end the "
            "list with the user, tool or system message it answers",
        )
    stream_options = body.get("stream_options")
    stream_options = {} if stream_options is None else stream_options
    if not isinstance(stream_options, Mapping):
        raise bad_request("stream_options", f"'stream_options' must be an object, got {json_type(stream_options)}")
    _check_stream_options(stream_options)
    tools, tool_choice, legacy = _tools_of(body)
    max_tokens, max_tokens_field = _max_tokens(body)
    return ChatRequest(
        messages=normalized,
        tools=tools,
        max_tokens=max_tokens,
        temperature=number_in(body, "temperature", 0.0, 2.0),
        top_p=number_in(body, "top_p", 0.0, 1.0, low_open=True),
        seed=integer_in(body, "seed", *SEED_RANGE),
        stop=_stop(body.get("stop")),
        stream=_boolean(body, "stream"),
        include_usage=_boolean(stream_options, "include_usage", "stream_options.include_usage"),
        model=body.get("model") if isinstance(body.get("model"), str) else None,
        tool_choice=tool_choice,
        top_k=top_k(body),
        repetition_penalty=number_in(body, "repetition_penalty", 0.0, 2.0, low_open=True),
        legacy_functions=legacy,
        max_tokens_field=max_tokens_field,
        reasoning_effort=body.get("reasoning_effort"),
    )


def _check_stream_options(options: Mapping[str, Any]) -> None:
    """``stream_options``' keys (openai.types.chat.ChatCompletionStreamOptionsParam): ``include_usage`` is read;
    ``include_obfuscation`` (random padding on stream events, a guard against network side channels) is not served
    and refused when true."""
    refuse_unknown_fields(options, _STREAM_OPTIONS, "chat-completions", "stream_options.", what="'stream_options'")
    _boolean(options, "include_obfuscation", "stream_options.include_obfuscation")
    if options.get("include_obfuscation"):
        raise bad_request(
            "stream_options.include_obfuscation",
            "'stream_options.include_obfuscation' is not served: the gateway pads no stream event (it adds no "
            "'obfuscation' field); set it false or leave it out",
            "unsupported",
        )


def _tools_of(body: Mapping[str, Any]) -> tuple[tuple[dict[str, Any], ...] | None, str, bool]:
    """The tools, tool_choice, and whether they came as the legacy ``functions`` / ``function_call``."""
    if body.get("functions") is None:
        if body.get("function_call") is not None:
            raise bad_request("function_call", "'function_call' needs 'functions' (or use 'tools' and 'tool_choice')")
        return _tools(body.get("tools")), _tool_choice(body.get("tool_choice")), False
    if body.get("tools") is not None:
        raise bad_request("functions", "give 'tools' or the legacy 'functions', not both")
    functions = body["functions"]
    if not isinstance(functions, list):
        raise bad_request("functions", f"'functions' must be a list of functions, got {json_type(functions)}")
    tools = [{"type": "function", "function": f} if isinstance(f, Mapping) else f for f in functions]
    try:
        checked = _tools(tools)
    except GatewayError as exc:
        param = (exc.param or "").replace("tools[", "functions[").replace(".function.", ".").replace(".function", "")
        raise bad_request(param, exc.message.replace("tools[", "functions["), exc.code or "invalid_value") from exc
    choice = body.get("function_call")
    if choice is not None and choice not in ("auto", "none"):
        raise bad_request(
            "function_call",
            f"function_call {choice!r} is not served: the engine samples freely and cannot be forced to call a "
            'function; use "auto" (or "none")',
            "unsupported",
        )
    return checked, choice or "auto", True


def top_k(body: Mapping[str, Any]) -> int | None:
    """``top_k``: a positive integer, or -1 / 0 / absent for no cut (SGLang's and vLLM's meaning of -1)."""
    value = integer_in(body, "top_k", -1, 2**31 - 1)
    return None if value is None or value <= 0 else value


def refuse_unknown_fields(
    body: Mapping[str, Any],
    known: Collection[str],
    api: str,
    where: str = "",
    aliases: Mapping[str, str] | None = None,
    *,
    what: str | None = None,
) -> None:
    """400 ``unknown_parameter`` for the first (sorted) key of ``body`` not in ``known``, with the closest known
    one (``aliases``: another API's name for a field -> this API's, e.g. chat's ``stop`` for the Messages API's
    ``stop_sequences``): a misspelt option would change nothing, and nothing a request says is ignored. ``where``:
    the object's path (``reasoning.``, ``tools[0].``), "" for the body. ``what``: a nested object's name
    (``a Responses function tool``): the refusal then lists its keys, in ``known``'s order, as the fix."""
    unknown = sorted(str(k) for k in body if k not in known)
    if not unknown:
        return
    close = [aliases[unknown[0]]] if aliases and unknown[0] in aliases else []
    close = close or difflib.get_close_matches(unknown[0], sorted(known), n=1)
    if what is None:
        hint = f"; did you mean '{where}{close[0]}'?" if close else ""
        message = f"is not a {api} field the gateway knows, so it would change nothing{hint}"
    else:
        hint = f" (did you mean '{where}{close[0]}'?)" if close else ""
        message = f"is not a key of {what}, so it would change nothing{hint}; its keys: {', '.join(map(repr, known))}"
    raise bad_request(f"{where}{unknown[0]}", f"'{where}{unknown[0]}' {message} (leave it out)", "unknown_parameter")


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    refuse_unknown_fields(body, KNOWN_FIELDS, "chat-completions", aliases=_OTHER_APIS_NAMES)
    for key, why in _REFUSED_FIELDS.items():
        if body.get(key) is not None:
            raise bad_request(key, f"'{key}' is not served: {why}", "unsupported")
    n = body.get("n")
    if n is not None and n != 1:
        raise bad_request("n", f"'n' must be 1 (one choice per request; a session is one rollout), got {n!r}")
    for key, defaults in _REFUSED_IF_SET.items():
        if body.get(key) not in defaults:
            raise bad_request(key, f"'{key}' is not supported by the gateway's engine; leave it out", "unsupported")
    for key, allowed in _REFUSED_OUTPUTS.items():
        if body.get(key) not in allowed:
            raise bad_request(
                key, f"'{key}' is not served: the gateway's engine writes text only; leave it out", "unsupported"
            )
    if body.get("parallel_tool_calls") is False:
        raise bad_request(
            "parallel_tool_calls",
            "'parallel_tool_calls': false is not served: the engine samples freely and may write several calls in "
            "one turn, and every call it wrote is returned (the tokens hold them all); leave it out or set it true",
            "unsupported",
        )
    response_format = body.get("response_format")
    if response_format is not None and not (
        isinstance(response_format, Mapping) and response_format.get("type") == "text"
    ):
        got = response_format.get("type") if isinstance(response_format, Mapping) else json_type(response_format)
        raise bad_request(
            "response_format",
            "'response_format': only the text format is served (no constrained decoding): "
            '{"type": "text"} or leave it out, '
            f"got {got!r}",
            "unsupported",
        )


def _message(message: Any, index: int) -> dict[str, Any]:
    where = f"messages[{index}]"
    problem = message_problem(message)
    if problem:
        raise bad_request(where, f"{where}: {problem}")
    role = _ROLE_ALIASES.get(message["role"], message["role"])
    if role not in ROLES:
        raise bad_request(f"{where}.role", f"{where}: unknown role {message['role']!r}; use one of {list(ROLES)}")
    _check_message_keys(message, where)
    out: dict[str, Any] = {"role": role, "content": _content(message.get("content"), where, role)}
    if role == "assistant":
        reasoning = message.get("reasoning_content", message.get("reasoning"))
        if reasoning is not None:
            if not isinstance(reasoning, str):
                raise bad_request(f"{where}.reasoning_content", f"{where}: 'reasoning_content' must be a string")
            out["reasoning_content"] = reasoning
        if message.get("tool_calls"):
            out["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{k}]") for k, c in enumerate(message["tool_calls"])]
    if role == "tool":
        if not isinstance(message.get("tool_call_id"), str):
            raise bad_request(
                f"{where}.tool_call_id",
                f"{where}: a tool message needs the 'tool_call_id' it answers; add the id of the assistant's tool call",
            )
        out["tool_call_id"] = message["tool_call_id"]
    if isinstance(message.get("name"), str) and role in ("tool", "user", "system"):
        out["name"] = message["name"]
    return out


def _check_message_keys(message: Mapping[str, Any], where: str) -> None:
    """The message holds only its role's keys; an assistant's ``audio`` or ``refusal`` the engine never wrote is
    refused rather than dropped."""
    role = message["role"]
    refuse_unknown_fields(
        message, _MESSAGE_KEYS[role], "chat-completions", f"{where}.", what=f"a message of role {role!r}"
    )
    for key, fix in (("audio", "the engine writes text only"), ("refusal", "send the text as 'content'")):
        if message.get(key) is not None:
            raise bad_request(
                f"{where}.{key}",
                f"{where}: an assistant '{key}' is not served (the gateway never answers with one): {fix}; leave "
                f"'{key}' out or null",
                "unsupported",
            )


def _content(content: Any, where: str, role: str) -> str | list[dict[str, Any]]:
    """The message's text (text parts joined); with images, its parts in order: text parts and each image decoded
    (``verl_ext.gateway.images``). An assistant message holds text only: the engine wrote it."""
    if content is None or isinstance(content, str):
        return content or ""
    parts: list[dict[str, Any]] = []
    for k, part in enumerate(content):  # message_problem checked each part is an object with a string type
        kind = part.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "image_url" and role != "assistant":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, Mapping) else url
            if url is None:
                raise bad_request(
                    f"{where}.content[{k}]",
                    f"{where}: content part {k} is an image_url part without 'image_url'; send "
                    '{"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}',
                )
            parts.append(image_part(image_from_url(url, f"{where}.content[{k}].image_url.url")))
        elif is_decoded_image_part(part) and role != "assistant":  # read by the Responses or Anthropic reader
            parts.append(dict(part))
        else:
            served = "text parts" if role == "assistant" else "text and image_url parts (images as data URLs)"
            raise bad_request(
                f"{where}.content[{k}]",
                f"{where}: content part {k} is {kind!r}; in a {role!r} message only {served} are served: send those",
                "unsupported" if kind in ("image_url", "image", "input_audio", "file") else "invalid_value",
            )
    return joined(parts)


def _tool_call(call: Mapping[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(call.get("id"), str) or not call["id"]:
        raise bad_request(
            f"{where}.id",
            f"{where}: a tool call needs its 'id' (tool messages answer it by that id); send the id the gateway "
            "gave it",
        )
    function = call["function"]
    arguments = function.get("arguments")
    return {"id": call["id"], "type": "function", "function": {"name": function["name"], "arguments": arguments}}


def _tools(tools: Any) -> tuple[dict[str, Any], ...] | None:
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad_request("tools", f"'tools' must be a list of function tools, got {json_type(tools)}")
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if (
            not isinstance(tool, Mapping)
            or tool.get("type") != "function"
            or not isinstance(tool.get("function"), Mapping)
        ):
            raise bad_request(where, f'{where}: must be {{"type": "function", "function": {{"name": ...}}}}')
        function = tool["function"]
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise bad_request(f"{where}.function.name", f"{where}: 'function'.'name' must be a non-empty string")
        parameters = function.get("parameters")
        if parameters is not None:
            check_parameters(parameters, f"{where}.function.parameters")
        check_description(function.get("description"), f"{where}.function.description")
        out.append({"type": "function", "function": dict(function)})
    return tuple(out) or None


def _max_tokens(body: Mapping[str, Any]) -> tuple[int | None, str]:
    """The output budget the client asked for (``max_completion_tokens``, else the older ``max_tokens``) and the
    field that gave it."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = _integer(body, key)
        if value is not None:
            if value < 1:
                raise bad_request(key, f"'{key}' must be at least 1, got {value}")
            return value, key
    return None, "max_tokens"


def _integer(body: Mapping[str, Any], key: str) -> int | None:
    return integer_in(body, key, 0, 2**31 - 1)


def integer_in(body: Mapping[str, Any], key: str, low: int, high: int) -> int | None:
    """``body[key]`` as an integer in [low, high]; None when absent; else a 400 naming the field."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(key, f"'{key}' must be an integer, got {json_type(value)}")
    if not low <= value <= high:
        raise bad_request(key, f"'{key}' must be in [{low}, {high}], got {value}")
    return value


def number_in(body: Mapping[str, Any], key: str, low: float, high: float, low_open: bool = False) -> float | None:
    """``body[key]`` as a float in [low, high] (``(low, high]`` with low_open); None when absent; else a 400 naming
    the field (both request shapes read their sampling numbers with it)."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad_request(key, f"'{key}' must be a number, got {json_type(value)}")
    if not math.isfinite(value):
        raise bad_request(key, f"'{key}' must be a finite number, got {value}")
    if value > high or value < low or (low_open and value == low):
        raise bad_request(key, f"'{key}' must be in {'(' if low_open else '['}{low:g}, {high:g}], got {value}")
    return float(value)


def _boolean(body: Mapping[str, Any], key: str, param: str | None = None) -> bool:
    value = body.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad_request(param or key, f"'{param or key}' must be true or false, got {json_type(value)}")
    return value


def _stop(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    values = [stop] if isinstance(stop, str) else stop
    if not isinstance(values, list) or not all(isinstance(s, str) and s for s in values) or len(values) > 4:
        raise bad_request("stop", "'stop' must be a non-empty string or a list of at most 4 of them")
    return tuple(values)


def _tool_choice(choice: Any) -> str:
    if choice is None or choice in ("auto", "none"):
        return choice or "auto"
    raise bad_request(
        "tool_choice",
        f"tool_choice {choice!r} is not served: the engine samples freely and cannot be forced to call a tool; "
        'use "auto" (or "none")',
        "unsupported",
    )


def error_for_bad_json(detail: str) -> GatewayError:
    """400 for a body that is not UTF-8 JSON."""
    return bad_request(
        None, f"the request body is not UTF-8 JSON: {detail}; send one JSON object, UTF-8 encoded", "invalid_json"
    )
