"""The demo's harness for ``verl_ext_gateway_agent`` (``verl-ext demo --loop gateway``, recipes/agent_harness): a small
ReAct calculator agent written against the official openai SDK, as a user writes one. Nothing in it knows verl or the
gateway: it gets a base URL, asks the model, runs every calculator call it gets back, sends the results, and stops at
the first turn without a tool call. Like most harnesses it sends back the assistant's content and tool calls but not
its reasoning.

It runs the demo's task (verl_ext/demo/data.py: the row's system and user messages) with the demo's calculator
(verl_ext/demo/calculator.py); the demo's reward (verl_ext/demo/reward.py) scores what the model wrote after the last
tool result, as for the built-in loop. Its return value is the row's ``extra_fields["harness_result"]``.

    +verl_ext=gateway verl_ext.harness.function=verl_ext.demo.harness:run
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from openai import AsyncOpenAI

from verl_ext.demo.calculator import calculate

MAX_TURNS = 4  # the gateway's token budget (rollout.response_length) ends a session first on the demo's settings
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression and return the result.",
        "parameters": {
            "type": "object",
            "properties": {
                "expression": {
                    "type": "string",
                    "description": 'An arithmetic expression: numbers, + - * / // % ** and parentheses, e.g. "12*7".',
                }
            },
            "required": ["expression"],
        },
    },
}


def run_tool(name: str, arguments: str) -> str:
    """What the harness sends back for one tool call: the calculator's answer, or an error the model can read."""
    if name != "calculator":
        return f"error: no tool named {name!r}; the only tool is calculator"
    try:
        expression = json.loads(arguments)["expression"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        return f"error: the arguments must be a JSON object with an expression ({type(exc).__name__})"
    return calculate(str(expression))


async def run(base_url: str, api_key: str, row: Mapping[str, Any]) -> dict[str, Any]:
    """One row: ask, run every tool call, send the results back, until a turn calls no tool (or ``MAX_TURNS``).
    Returns the final answer, the number of model turns and of tool calls, and the last finish reason."""
    messages: list[dict[str, Any]] = [dict(m) for m in row["raw_prompt"]]
    calls = 0
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        for turn in range(1, MAX_TURNS + 1):
            response = await client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR])
            choice = response.choices[0]
            message = choice.message
            tool_calls = list(message.tool_calls or [])
            assistant: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
            if tool_calls:
                assistant["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.function.name, "arguments": c.function.arguments},
                    }
                    for c in tool_calls
                ]
            messages.append(assistant)
            # a turn cut at the token budget ("length") is an ordinary end of the rollout in RL, not an error: this
            # harness calls create() (the SDK's stream()/parse() helpers raise LengthFinishReasonError on such a turn
            # with strict tools; docs/gateway.md, "Turns cut at the budget")
            if choice.finish_reason != "tool_calls":
                return {"answer": message.content, "turns": turn, "tool_calls": calls, "finish": choice.finish_reason}
            for c in tool_calls:
                calls += 1
                messages.append(
                    {"role": "tool", "tool_call_id": c.id, "content": run_tool(c.function.name, c.function.arguments)}
                )
    return {"answer": None, "turns": MAX_TURNS, "tool_calls": calls, "finish": "max_turns"}
