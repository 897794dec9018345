"""Write the demo's arithmetic tool-calling dataset as verl parquet rows (train and val); and the VL demo's
screen questions (a prompt image each, ``make_screen_rows``).

Each row: ``data_source``, ``prompt`` (system + user messages asking to use the calculator), ``ability``,
``reward_model`` ``{style: rule, ground_truth}``, ``extra_info`` ``{index, split, expression, need_tools_kwargs}``.
verl's stock tool agent reads ``raw_prompt`` (built from ``prompt``), ``extra_info.index`` and
``extra_info.tools_kwargs`` (not needed: the calculator is a stateless function tool). Usage::

    python -m verl_ext.demo.data --out build/demo/data
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

DATA_SOURCE = "verl_ext/calculator_demo"
SYSTEM_PROMPT = (
    "You are a careful calculator agent. For any arithmetic, call the calculator tool, then state the final "
    "answer as a number."
)
_OPS = ("+", "-", "*")


def make_rows(n: int, split: str, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` deterministic questions like "What is 12 * 7?" with their integer answers."""
    rng = random.Random(f"{seed}-{split}")
    rows = []
    for index in range(n):
        a, b, op = rng.randint(2, 99), rng.randint(2, 99), rng.choice(_OPS)
        expression = f"{a} {op} {b}"
        answer = {"+": a + b, "-": a - b, "*": a * b}[op]
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": f"What is {expression}? Use the calculator tool."},
                ],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(answer)},
                "extra_info": {"index": index, "split": split, "expression": expression, "need_tools_kwargs": False},
            }
        )
    return rows


SCREEN_DATA_SOURCE = "verl_ext/screen_demo"
SCREEN_SYSTEM_PROMPT = "You are a GUI agent. Look at the screen with the screenshot tool before you answer."


def icon_png(width: int, height: int, colour: tuple[int, int, int]) -> bytes:
    """A plain PNG of ``width`` x ``height`` (the VL demo's prompt image)."""
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def make_screen_rows(n: int, split: str, seed: int = 0) -> list[dict[str, Any]]:
    """``n`` rows of the VL demo: an app icon in the prompt (verl's ``images`` column, ``<image>`` in the text, as
    ``RLHFDataset`` reads them) of a size per row, so the placeholder count differs, and a question only a
    screenshot answers."""
    rng = random.Random(f"screen-{seed}-{split}")
    rows = []
    for index in range(n):
        width, height = rng.choice((56, 84, 112)), rng.choice((56, 84))
        colour = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        rows.append(
            {
                "data_source": SCREEN_DATA_SOURCE,
                "prompt": [
                    {"role": "system", "content": SCREEN_SYSTEM_PROMPT},
                    {"role": "user", "content": "<image>\nThis is the app's icon. How many buttons has the top bar?"},
                ],
                "images": [{"bytes": icon_png(width, height, colour)}],
                "ability": "gui",
                "reward_model": {"style": "rule", "ground_truth": "3"},
                "extra_info": {"index": index, "split": split, "need_tools_kwargs": False},
            }
        )
    return rows


def rows_naming(rows: Any, loops: Sequence[str]) -> Any:
    """``rows`` (a row maker, as ``write_dataset`` takes it) with each row naming one of ``loops`` in turn in verl's
    ``agent_name`` column (row i: ``loops[i % len(loops)]``)."""

    def make(n: int, split: str, seed: int = 0) -> list[dict[str, Any]]:
        made = rows(n, split, seed)
        for index, row in enumerate(made):
            row["agent_name"] = loops[index % len(loops)]
        return made

    return make


def write_dataset(
    out_dir: str | Path, n_train: int = 8, n_val: int = 2, seed: int = 0, rows: Any = None
) -> dict[str, Path]:
    """Write ``train.parquet`` and ``val.parquet`` in ``out_dir``; return split -> path. ``rows`` makes the rows
    (``make_rows``, the calculator's, by default; ``make_screen_rows`` for the VL demo)."""
    import pandas as pd

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n in (("train", n_train), ("val", n_val)):
        path = out / f"{split}.parquet"
        pd.DataFrame((rows or make_rows)(n, split, seed)).to_parquet(path)
        paths[split] = path
    return paths


def main(argv: list[str] | None = None) -> None:
    """Write the calculator dataset (train and validation parquet files) to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--train", type=int, default=8)
    parser.add_argument("--val", type=int, default=2)
    args = parser.parse_args(argv)
    for split, path in write_dataset(args.out, args.train, args.val).items():
        print(f"{split}: {path}")


if __name__ == "__main__":
    main()
