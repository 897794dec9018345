"""A safe arithmetic evaluator, the body of the demo's calculator tool (kept apart from the tool declaration so it
can be imported anywhere without registering a verl function tool)."""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_MAX_EXPONENT = 64  # a model-written 9**9**9 must not hang the rollout


def evaluate(expression: str) -> int | float:
    """Evaluate an arithmetic expression of numbers, + - * / // % ** and parentheses; nothing else is accepted."""

    def walk(node: ast.AST) -> int | float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
                raise ValueError("exponent too large")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](walk(node.operand))
        raise ValueError(f"unsupported expression element: {type(node).__name__}")

    return walk(ast.parse(expression, mode="eval"))


def format_number(value: int | float) -> str:
    """``84`` for integral results (``84.0`` included), else the float's repr."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def calculate(expression: str) -> str:
    """The tool's answer: the formatted result, or ``error: ...`` for anything it refuses or cannot compute."""
    try:
        return format_number(evaluate(expression))
    except (ValueError, SyntaxError, ZeroDivisionError, OverflowError) as e:
        return f"error: {e}"
