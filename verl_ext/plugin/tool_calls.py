"""Turn an assistant turn's tool calls into tool messages; every failure becomes a message and a counted status.

Parsing is ``verl_ext.core.turn_parse.parse_turn`` (verl's ``ToolParser``, the same formats as verl's
``tool_agent``; the gateway calls the same function); execution calls verl's tools
(``FunctionTool`` or ``BaseTool``) with a timeout. Nothing here raises for a bad call: the model gets a tool
message saying what was wrong, and the status is counted in ``tito/tool/*`` metrics.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from verl_ext.core.turn_parse import ParsedCall, ParsedTurn, arguments_object, call_id, parse_turn

# The parse step lives in the core, shared with the gateway; imported here for the loop's callers.
from verl_ext.plugin.image_loop import tool_message
from verl_ext.runtime.images import UnusableImage, tool_image

__all__ = [
    "ParsedCall",
    "ParsedTurn",
    "ToolOutcome",
    "ToolStatus",
    "call_id",
    "over_limit_message",
    "parse_turn",
    "run_tool",
]

log = logging.getLogger("verl_ext.plugin")


class ToolStatus(StrEnum):
    """How one tool call went (counted in ``tito/tool/<status>``)."""

    OK = "ok"
    MALFORMED = "malformed"  # the model wrote a tool call the parser could not read
    UNKNOWN_TOOL = "unknown_tool"
    BAD_ARGUMENTS = "bad_arguments"  # arguments are not a JSON object
    ERROR = "error"  # the tool raised
    TIMEOUT = "timeout"
    BAD_IMAGE = "bad_image"  # the tool answered with an image the processor cannot read


@dataclass(frozen=True)
class ToolOutcome:
    """A tool call's result: the tool message to append, its status, and the reward the tool returned (if any)."""

    message: dict[str, Any]
    status: ToolStatus
    reward: float | None = None


def over_limit_message(call: ParsedCall, limit: int) -> dict[str, Any]:
    """The tool message answering a call made past ``max_parallel_calls``: not run, and the model is told why."""
    text = f"Error: tool call {call.name!r} was not run: at most {limit} tool calls per turn"
    return {"role": "tool", "content": text, "tool_call_id": call.call_id, "name": call.name}


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
    args = arguments_object(call.arguments)
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
    done = outcome(response.text or "", ToolStatus.OK, reward)
    if not response.image:
        return done
    # a tool may answer with images (verl's ToolResponse.image): content parts before its text, never dropped; one
    # the processor cannot read is the tool's failure, told to the model as a raised tool's is (not a crashed step)
    try:
        images = [tool_image(image) for image in response.image]
    except UnusableImage as exc:
        log.warning("tool %r answered with an unusable image: %s", call.name, exc)
        return outcome(f"Error: tool {call.name!r} answered with an unusable image: {exc}", ToolStatus.BAD_IMAGE)
    return dataclasses.replace(done, message=tool_message(done.message, images))


async def _release(tool: Any, instance_id: str) -> None:
    """A tool that fails to clean up has still answered: log it, keep the answer."""
    try:
        await tool.release(instance_id)
    except Exception as exc:
        log.error("tool %r failed to release instance %s: %s: %s", tool.name, instance_id, type(exc).__name__, exc)
