"""GSM8K-style data for the multi-node GRPO recipe, as verl parquet rows, from a local file (the Hub may be
unreachable). Input: JSON lines or parquet with ``question`` and ``answer`` (GSM8K's format: the final answer after
``####``). Each row asks the model to use the calculator tool; ``data_source`` ``openai/gsm8k`` selects verl's GSM8K
scorer (the last ``####`` number in the response, or the last number).

    python recipes/gsm8k_qwen3_sglang/prepare_data.py --train gsm8k/train.jsonl --test gsm8k/test.jsonl --out data/
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

SYSTEM_PROMPT = (
    "You are a careful math assistant. Use the calculator tool for arithmetic. End with the final answer as "
    '"#### <number>".'
)


class DataError(ValueError):
    """A bad input file or row; the message names the file and the row (line) and what a row must hold."""


ROW_SHAPE = "GSM8K rows are objects with a 'question' and an 'answer' ending in '#### <number>'"


def read_rows(path: Path) -> list[tuple[str, Any]]:
    """(where, row) for every row of a .jsonl or .parquet file; ``where`` is ``file:line`` or ``file row N``."""
    if path.suffix == ".parquet":
        import pandas as pd

        try:
            frame = pd.read_parquet(path)
        except Exception as exc:  # pyarrow's errors have no common base: any failure to read is the file's
            raise DataError(f"{path}: not a readable parquet file ({type(exc).__name__}: {exc})") from None
        return [(f"{path} row {i}", row) for i, row in enumerate(frame.to_dict("records"))]
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: cannot be read as UTF-8 JSON lines ({type(exc).__name__}: {exc})") from None
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append((f"{path}:{n}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{n}: not a JSON line ({exc.msg}); {ROW_SHAPE}") from None
    return rows


def final_answer(answer: str) -> str:
    """The number after the last ``####``, without thousands separators. Raises ValueError when there is none."""
    if "####" not in answer:
        raise ValueError(f"no '#### <number>' final answer in {answer[-80:]!r}")
    number = answer.split("####")[-1].strip().replace(",", "")
    if not number:
        raise ValueError(f"nothing after the final '####' in {answer[-80:]!r}")
    return number


def to_verl(rows: list[tuple[str, Any]], split: str, source: Path) -> list[dict[str, Any]]:
    """verl rows (prompt, data_source, reward_model, extra_info). Raises DataError naming the first bad row."""
    out = []
    for i, (where, row) in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{where}: a {type(row).__name__}, not an object; {ROW_SHAPE}")
        missing = sorted({"question", "answer"} - set(row))
        if missing:
            raise DataError(f"{where}: the row lacks {missing}; {ROW_SHAPE}")
        if not isinstance(row["question"], str) or not row["question"].strip():
            raise DataError(f"{where}: 'question' must be non-empty text, got {row['question']!r}")
        try:
            answer = final_answer(str(row["answer"]))
        except ValueError as exc:
            raise DataError(f"{where}: {exc}; {ROW_SHAPE}") from None
        out.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": row["question"]},
                ],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"index": i, "split": split},
            }
        )
    if not out:
        raise DataError(f"{source}: no rows; {ROW_SHAPE}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=Path, required=True, help="local GSM8K train file (.jsonl or .parquet)")
    parser.add_argument("--test", type=Path, required=True, help="local GSM8K test file (.jsonl or .parquet)")
    parser.add_argument("--out", type=Path, required=True, help="folder for train.parquet and test.parquet")
    args = parser.parse_args(argv)
    splits = {}
    try:  # every input read and converted before anything is written: a bad row leaves no folder behind
        for split, path in (("train", args.train), ("test", args.test)):
            if not path.is_file():
                raise DataError(f"{path} does not exist (or is not a file)")
            splits[split] = to_verl(read_rows(path), split, path)
    except DataError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    import pandas as pd

    args.out.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        pd.DataFrame(rows).to_parquet(args.out / f"{split}.parquet")
        print(f"{split}: {len(rows)} rows -> {args.out / f'{split}.parquet'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
