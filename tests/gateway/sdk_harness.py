"""Harnesses written against the official OpenAI SDK, as users write them (nothing here knows the gateway)."""

from __future__ import annotations

import ast
import json
import operator
from typing import Any

from openai import OpenAI

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculate(expression: str) -> str:
    """Evaluate + - * / over numbers; an error message for anything else (the model reads it)."""

    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(f"unsupported expression: {ast.dump(node)}")

    try:
        result = value(ast.parse(expression, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as exc:
        return f"error: {exc}"
    return str(int(result)) if float(result).is_integer() else str(result)


def react_calculator(
    client: OpenAI,
    question: str,
    tools: list[dict[str, Any]],
    max_turns: int = 4,
    max_tokens: int | None = 64,
    prompt: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A ReAct loop: ask, run every tool call, send the results back, until the model answers. Like many harnesses
    it drops the reasoning and re-serializes the arguments it sends back. ``prompt``: the first messages (default: a
    system message and ``question``); ``max_tokens`` None: none asked for."""
    messages: list[dict[str, Any]] = (
        [dict(m) for m in prompt]
        if prompt
        else [
            {"role": "system", "content": "Use the calculator for arithmetic."},
            {"role": "user", "content": question},
        ]
    )
    responses = []
    budget = {} if max_tokens is None else {"max_tokens": max_tokens}
    for _ in range(max_turns):
        response = client.chat.completions.create(model="policy", messages=messages, tools=tools, **budget)
        responses.append(response)
        choice = response.choices[0]
        message = choice.message
        calls = message.tool_calls or []
        messages.append(
            {
                "role": "assistant",
                "content": message.content,
                "tool_calls": [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {
                            "name": c.function.name,
                            "arguments": json.dumps(json.loads(c.function.arguments), separators=(",", ":")),
                        },
                    }
                    for c in calls
                ]
                or None,
            }
        )
        if choice.finish_reason != "tool_calls":
            return {"answer": message.content, "messages": messages, "responses": responses}
        for c in calls:
            result = calculate(json.loads(c.function.arguments)["expression"])
            messages.append({"role": "tool", "tool_call_id": c.id, "content": result})
    return {"answer": None, "messages": messages, "responses": responses}


CALCULATOR_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


def loop_react(base_url: str, api_key: str, row: dict[str, Any]) -> dict[str, Any]:
    """The ReAct calculator as ``verl_ext_gateway_agent`` calls a harness (sync): the row's last user message is
    the question; the tools are the calculator's schema."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    question = [m for m in row["raw_prompt"] if m["role"] == "user"][-1]["content"]
    out = react_calculator(client, question, CALCULATOR_TOOLS)
    return {"answer": out["answer"], "turns": len(out["responses"])}


def loop_row(base_url: str, api_key: str, row: dict[str, Any]) -> dict[str, Any]:
    """The ReAct calculator on the row's own prompt and tools (``row["harness_tools"]``: the loop's tool schemas),
    asking no budget of its own: the conversation ``verl_ext_tool_agent`` has with the same row."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    out = react_calculator(client, "", row["harness_tools"], max_tokens=None, prompt=row["raw_prompt"])
    return {"answer": out["answer"], "turns": len(out["responses"])}


def loop_forking(base_url: str, api_key: str, row: dict[str, Any]) -> dict[str, Any]:
    """The ReAct calculator, then its conversation again up to the first tool result, edited, for one more answer
    (as a harness exploring an alternative does): the gateway forks the session there. Turns are cut short (40
    tokens, 8 for the fork: a tiny random model's answers are noise; the forced first call fits whole)."""
    client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=120)
    question = [m for m in row["raw_prompt"] if m["role"] == "user"][-1]["content"]
    out = react_calculator(client, question, CALCULATOR_TOOLS, max_turns=2, max_tokens=40)
    messages = out["messages"]
    at = next(i for i, m in enumerate(messages) if m["role"] == "tool")
    edited = [*messages[:at], {**messages[at], "content": "-1"}]
    client.chat.completions.create(model="policy", messages=edited, tools=CALCULATOR_TOOLS, max_tokens=8)
    return {"answer": out["answer"], "turns": len(out["responses"]) + 1}


async def loop_failing(base_url: str, api_key: str, row: dict[str, Any]) -> None:
    """A harness that raises after one call."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    raise RuntimeError("the harness gave up")
