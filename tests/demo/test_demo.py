"""The CPU demo's dataset rows, calculator and reward."""

from __future__ import annotations

from pathlib import Path

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


def test_screen_rows_carry_one_image_per_placeholder() -> None:
    import io

    from PIL import Image

    from verl_ext.demo.data import make_screen_rows

    rows = make_screen_rows(6, "train")
    assert rows == make_screen_rows(6, "train")
    sizes = set()
    for row in rows:
        # verl's RLHFDataset pairs each "<image>" in the text with the next entry of the images column
        assert sum(m["content"].count("<image>") for m in row["prompt"]) == len(row["images"]) == 1
        image = Image.open(io.BytesIO(row["images"][0]["bytes"]))
        assert image.format == "PNG"
        sizes.add(image.size)
    assert len(sizes) > 1  # sizes differ, so the placeholder counts differ


def test_vl_demo_command_names_the_screenshot_tool_and_the_vl_settings(tmp_path: Path) -> None:
    from verl_ext.demo.run import VL_OVERRIDES, trainer_command

    paths = {"model": tmp_path / "m", "train": tmp_path / "t", "val": tmp_path / "v"}
    vl = trainer_command(paths, tmp_path, 1, "v1", ["x=1"], model="qwen2.5-vl")
    text = trainer_command(paths, tmp_path, 1, "v1", ["x=1"])
    assert any("function_tool_path=" in a and a.endswith("screenshot_tool.py") for a in vl)
    assert set(VL_OVERRIDES) <= set(vl) and not set(VL_OVERRIDES) & set(text)
    assert vl[-1] == "x=1"  # the user's overrides come last, so they win


def test_demo_refuses_choices_it_has_not(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from verl_ext.cli.main import main as cli
    from verl_ext.core.errors import OptionsError
    from verl_ext.demo.run import check_choices

    with pytest.raises(OptionsError, match="--loop tool only"):
        check_choices("gateway", "qwen2.5-vl")
    with pytest.raises(OptionsError, match="model must be one of"):
        check_choices("tool", "llama")
    out = tmp_path / "never"
    assert cli(["demo", "--model", "qwen2.5-vl", "--loop", "gateway", "--out", str(out)]) == 2
    assert "--loop tool only" in capsys.readouterr().err
    assert not out.exists()  # refused before the output folder is made
