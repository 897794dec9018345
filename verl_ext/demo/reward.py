"""The demo's rule reward, for ``reward.custom_reward_function.path`` (function ``compute_score``).

1.0 when the final answer contains the ground-truth number, else 0.0. The final answer is the text after the last
tool response, so a correct number echoed by the calculator does not count as the model's answer.
"""

from __future__ import annotations

import re
from typing import Any

_TOOL_RESPONSE_END = "</tool_response>"


def final_answer(solution_str: str) -> str:
    """The text the model wrote after the last tool response (all of it when no tool was called)."""
    return solution_str.rsplit(_TOOL_RESPONSE_END, 1)[-1]


def contains_number(text: str, number: str) -> bool:
    """True when ``number`` occurs in ``text`` as a whole number (``84`` is not found in ``184`` or ``8.45``)."""
    return re.search(rf"(?<![\d.]){re.escape(number.strip())}(?![\d]|\.\d)", text) is not None


def compute_score(
    data_source: str, solution_str: str, ground_truth: str, extra_info: dict[str, Any] | None = None, **kwargs: Any
) -> float:
    """verl's reward function: 1.0 when the final answer contains the ground-truth number, else 0.0."""
    return 1.0 if contains_number(final_answer(solution_str), str(ground_truth)) else 0.0
