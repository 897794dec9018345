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


def react_calculator(client: OpenAI, question: str, tools: list[dict[str, Any]], max_turns: int = 4) -> dict[str, Any]:
    """A ReAct loop: ask, run every tool call, send the results back, until the model answers. Like many harnesses
    it drops the reasoning and re-serializes the arguments it sends back."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Use the calculator for arithmetic."},
        {"role": "user", "content": question},
    ]
    responses = []
    for _ in range(max_turns):
        response = client.chat.completions.create(model="policy", messages=messages, tools=tools, max_tokens=64)
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
