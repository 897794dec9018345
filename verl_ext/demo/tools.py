"""The demo's calculator, as a verl 0.9.1 *function tool*: ``actor_rollout_ref.rollout.multi_turn.function_tool_path``
points at this file, verl executes it and collects every ``@function_tool``. (The alternative, a ``BaseTool``
subclass listed in a ``tool_config_path`` YAML, adds a lifecycle a stateless calculator does not need.)

Load it only through verl (``load_function_tools_from_path``): verl refuses a second registration of ``calculator``
from another module object. The evaluator itself is in verl_ext.demo.calculator.
"""

from __future__ import annotations

from verl.tools.function_tool import function_tool

from verl_ext.demo.calculator import calculate


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: An arithmetic expression using numbers, + - * / // % ** and parentheses, e.g. "12*7".
    """
    return calculate(expression)
