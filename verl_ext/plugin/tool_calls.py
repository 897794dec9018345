"""Turn an assistant turn's tool calls into tool messages; every failure becomes a message and a counted status.

Parsing uses verl's ``ToolParser`` (the same formats as verl's ``tool_agent``); execution calls verl's tools
(``FunctionTool`` or ``BaseTool``) with a timeout. Nothing here raises for a bad call: the model gets a tool
message saying what was wrong, and the status is counted in ``tito/tool/*`` metrics.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

log = logging.getLogger("verl_ext.plugin")


class ToolStatus(StrEnum):
    """How one tool call went (counted in ``tito/tool/<status>``)."""

    OK = "ok"
    MALFORMED = "malformed"  # the model wrote a tool call the parser could not read
    UNKNOWN_TOOL = "unknown_tool"
    BAD_ARGUMENTS = "bad_arguments"  # arguments are not a JSON object
    ERROR = "error"  # the tool raised
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class ParsedCall:
    """One tool call the parser read from a turn's output."""

    name: str
    arguments: str  # JSON text as the model wrote it (verl re-dumps parsed JSON)
    call_id: str


@dataclass(frozen=True)
class ToolOutcome:
    """A tool call's result: the tool message to append, its status, and the reward the tool returned (if any)."""

    message: dict[str, Any]
    status: ToolStatus
    reward: float | None = None


def call_id(turn: int, index: int) -> str:
    """A 9-character alphanumeric id (Mistral's templates require exactly that) when the model wrote none."""
    return f"c{turn:04d}{index:04d}"


def malformed_count(parser: Any, text: str, parsed: int) -> int:
    """Tool-call blocks the parser saw but could not read (parsers with a ``tool_call_regex``, e.g. hermes)."""
    regex = getattr(parser, "tool_call_regex", None)
    if regex is None:
        return 0
    return max(0, len(regex.findall(text)) - parsed)


def assistant_message(content: str, calls: Sequence[ParsedCall]) -> dict[str, Any]:
    """The assistant message for the template: ``content``, and ``tool_calls`` when there are calls (arguments as
    a JSON object where they parse to one, else the text the model wrote)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
            for c in calls
        ]
    return message


@dataclass(frozen=True)
class ParsedTurn:
    """One assistant turn read from its output ids: the message for the template (every call the model wrote, so
    that it describes the sampled tokens), the calls to run (at most ``max_parallel_calls``), the calls read past
    that limit (answered with an error, never run), and how many tool calls the parser could not read."""

    message: dict[str, Any]
    calls: list[ParsedCall]
    dropped: list[ParsedCall]
    malformed: int


async def parse_turn(
    tool_parser: Any,
    ids: Sequence[int],
    end_of_turn_ids: frozenset[int],
    decode: Any,
    schemas: Sequence[Any],
    turn: int,
    max_parallel_calls: int,
) -> ParsedTurn:
    """One turn's output ids, minus an end-of-turn stop, read by verl's ``tool_parser``: the one step every verl_ext
    loop uses to turn sampled ids into a message (the ids themselves stay as sampled). ``decode`` decodes ids to
    text (to count malformed calls)."""
    # only an end-of-turn stop is not content; a user stop id such as </tool_call> is part of the call
    body = list(ids[:-1] if ids and ids[-1] in end_of_turn_ids else ids)
    content, found = await tool_parser.extract_tool_calls(body, list(schemas))
    parsed = [ParsedCall(c.name, c.arguments, c.tool_call_id or call_id(turn, i)) for i, c in enumerate(found)]
    malformed = malformed_count(tool_parser, decode(body), len(found))
    limit = max(0, max_parallel_calls)
    return ParsedTurn(assistant_message(content, parsed), parsed[:limit], parsed[limit:], malformed)


def over_limit_message(call: ParsedCall, limit: int) -> dict[str, Any]:
    """The tool message answering a call made past ``max_parallel_calls``: not run, and the model is told why."""
    text = f"Error: tool call {call.name!r} was not run: at most {limit} tool calls per turn"
    return {"role": "tool", "content": text, "tool_call_id": call.call_id, "name": call.name}


def _arguments(text: str) -> Any:
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text
    return value if isinstance(value, dict) else text


async def run_tool(
    call: ParsedCall, tools: Mapping[str, Any], tools_kwargs: Mapping[str, Any], agent_data: Any, timeout_s: float
) -> ToolOutcome:
    """Run one call with verl's tool API. Never raises for the tool's sake: an unknown tool, bad arguments, an
    exception or a timeout becomes an error tool message for the model, with its status."""
    from verl.tools.function_tool import FunctionTool, normalize_function_tool_return

    def outcome(text: str, status: ToolStatus, reward: float | None = None) -> ToolOutcome:
        message = {"role": "tool", "content": text, "tool_call_id": call.call_id, "name": call.name}
        return ToolOutcome(message, status, reward)

    tool = tools.get(call.name)
    if tool is None:
        return outcome(f"Error: unknown tool {call.name!r}; available tools: {sorted(tools)}", ToolStatus.UNKNOWN_TOOL)
    args = _arguments(call.arguments)
    if not isinstance(args, dict):
        return outcome(
            f"Error: arguments for {call.name!r} must be a JSON object, got {call.arguments!r}",
            ToolStatus.BAD_ARGUMENTS,
        )
    instance_id = None
    try:
        if isinstance(tool, FunctionTool):
            raw = await asyncio.wait_for(tool.call(args), timeout_s)
            response, reward, _ = normalize_function_tool_return(raw)
        else:
            kwargs = dict(tools_kwargs.get(call.name, {}) or {})
            instance_id, _ = await asyncio.wait_for(
                tool.create(create_kwargs=kwargs.get("create_kwargs", {})), timeout_s
            )
            response, reward, _ = await asyncio.wait_for(
                tool.execute(instance_id, args, agent_data=agent_data), timeout_s
            )
    except TimeoutError:
        return outcome(f"Error: tool {call.name!r} timed out after {timeout_s:g} s", ToolStatus.TIMEOUT)
    except Exception as exc:  # the tool's failure is the model's observation, not a crashed step
        log.warning("tool %r raised %s: %s", call.name, type(exc).__name__, exc)
        return outcome(f"Error: tool {call.name!r} failed: {type(exc).__name__}: {exc}", ToolStatus.ERROR)
    finally:
        if instance_id is not None and not isinstance(tool, FunctionTool):
            await _release(tool, instance_id)
    return outcome(response.text or "", ToolStatus.OK, reward)


async def _release(tool: Any, instance_id: str) -> None:
    """A tool that fails to clean up has still answered: log it, keep the answer."""
    try:
        await tool.release(instance_id)
    except Exception as exc:
        log.error("tool %r failed to release instance %s: %s: %s", tool.name, instance_id, type(exc).__name__, exc)
