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
from collections.abc import Mapping, Sequence
from typing import Any

from openai import AsyncOpenAI, LengthFinishReasonError

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


# The calculator with a strict schema: the SDK's stream and parse helpers parse the calls of strict tools, and raise
# LengthFinishReasonError on a turn cut at the token budget (``next_turn`` shows the pattern that reads it).
STRICT_CALCULATOR = {
    "type": "function",
    "function": {**CALCULATOR["function"], "strict": True, "parameters": {**CALCULATOR["function"]["parameters"]}},
}
STRICT_CALCULATOR["function"]["parameters"]["additionalProperties"] = False


async def next_turn(
    client: AsyncOpenAI, messages: list[dict[str, Any]], tools: Sequence[Mapping[str, Any]], stream: bool = False
) -> Any:
    """The model's next turn (the completion's one choice). ``stream``: through the SDK's stream helper,
    ``client.chat.completions.stream``, which raises ``LengthFinishReasonError`` on a turn cut at the token budget
    when the tools are strict (``STRICT_CALCULATOR``). In RL a cut turn is an ordinary end of the rollout, and its
    tokens are trained: the partial turn is on the error (``.completion``), so it is taken from there. Without
    ``stream``, ``create()``, which never raises for a cut turn (nor does ``create(stream=True)``)."""
    if not stream:
        response = await client.chat.completions.create(model="policy", messages=messages, tools=list(tools))
        return response.choices[0]
    try:
        async with client.chat.completions.stream(model="policy", messages=messages, tools=list(tools)) as events:
            async for _ in events:
                pass
            completion = await events.get_final_completion()
    except LengthFinishReasonError as cut:  # finish_reason "length": the rollout ends here, the turn as sampled
        completion = cut.completion
    return completion.choices[0]


def run_tool(name: str, arguments: str) -> str:
    """What the harness sends back for one tool call: the calculator's answer, or an error the model can read."""
    if name != "calculator":
        return f"error: no tool named {name!r}; the only tool is calculator"
    try:
        expression = json.loads(arguments)["expression"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        return f"error: the arguments must be a JSON object with an expression ({type(exc).__name__})"
    return calculate(str(expression))


async def run(
    base_url: str,
    api_key: str,
    row: Mapping[str, Any],
    *,
    stream: bool = False,
    tools: Sequence[Mapping[str, Any]] = (CALCULATOR,),
) -> dict[str, Any]:
    """One row: ask, run every tool call, send the results back, until a turn calls no tool (or ``MAX_TURNS``).
    Returns the final answer, the number of model turns and of tool calls, and the last finish reason. ``stream``
    and ``tools``: how each turn is asked (``next_turn``; the demo asks with ``create()`` and the plain schema)."""
    messages: list[dict[str, Any]] = [dict(m) for m in row["raw_prompt"]]
    calls = 0
    async with AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as client:
        for turn in range(1, MAX_TURNS + 1):
            choice = await next_turn(client, messages, tools, stream)
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
            # a turn cut at the token budget ("length") is an ordinary end of the rollout in RL, not an error (the
            # SDK's stream()/parse() helpers raise LengthFinishReasonError on such a turn with strict tools:
            # next_turn reads it; docs/gateway.md, "Turns cut at the budget")
            if choice.finish_reason != "tool_calls":
                return {"answer": message.content, "turns": turn, "tool_calls": calls, "finish": choice.finish_reason}
            for c in tool_calls:
                calls += 1
                messages.append(
                    {"role": "tool", "tool_call_id": c.id, "content": run_tool(c.function.name, c.function.arguments)}
                )
    return {"answer": None, "turns": MAX_TURNS, "tool_calls": calls, "finish": "max_turns"}
