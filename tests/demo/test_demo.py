"""The CPU demo's dataset rows, calculator and reward."""

from __future__ import annotations

import pytest

from verl_ext.demo.calculator import calculate, evaluate
from verl_ext.demo.data import make_rows
from verl_ext.demo.reward import compute_score, final_answer


def test_rows_have_the_fields_verl_reads() -> None:
    rows = make_rows(3, "train")
    assert rows == make_rows(3, "train")  # deterministic
    for i, row in enumerate(rows):
        assert [m["role"] for m in row["prompt"]] == ["system", "user"]
        assert row["reward_model"]["style"] == "rule"
        assert row["extra_info"]["index"] == i and row["extra_info"]["split"] == "train"
        assert str(eval(row["extra_info"]["expression"])) == row["reward_model"]["ground_truth"]


def test_calculator() -> None:
    assert evaluate("12 * 7") == 84 and calculate("10 / 4") == "2.5" and calculate("(3 + 5) / 2") == "4"
    for bad in ("__import__('os')", "2 ** 999", "x + 1"):
        with pytest.raises(ValueError):
            evaluate(bad)
    assert calculate("1 / 0").startswith("error:")


def test_reward_reads_only_the_text_after_the_last_tool_response() -> None:
    response = '<tool_call>{"name": "calculator"}</tool_call>user\n<tool_response>\n84\n</tool_response>assistant\n'
    assert final_answer(response + "It is 84.") == "assistant\nIt is 84."
    assert compute_score("d", response + "The answer is 84.", "84") == 1.0
    assert compute_score("d", response + "The answer is 184.", "84") == 0.0
    assert compute_score("d", response + "I do not know.", "84") == 0.0
    assert compute_score("d", "so -41 it is", "-41") == 1.0
