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


def read_rows(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict("records")
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise SystemExit(
                    f"{path}:{n}: not a JSON line ({exc}); expected {{'question': ..., 'answer': ...}}"
                ) from exc
    return rows


def final_answer(answer: str) -> str:
    if "####" not in answer:
        raise ValueError(f"no '#### <number>' final answer in {answer[-80:]!r}")
    return answer.split("####")[-1].strip().replace(",", "")


def to_verl(rows: list[dict[str, Any]], split: str, source: Path) -> list[dict[str, Any]]:
    out = []
    for i, row in enumerate(rows):
        missing = {"question", "answer"} - set(row)
        if missing:
            raise SystemExit(f"{source}: row {i} lacks {sorted(missing)}; GSM8K rows have 'question' and 'answer'")
        out.append(
            {
                "data_source": "openai/gsm8k",
                "prompt": [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": row["question"]},
                ],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": final_answer(str(row["answer"]))},
                "extra_info": {"index": i, "split": split},
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=Path, required=True, help="local GSM8K train file (.jsonl or .parquet)")
    parser.add_argument("--test", type=Path, required=True, help="local GSM8K test file (.jsonl or .parquet)")
    parser.add_argument("--out", type=Path, required=True, help="folder for train.parquet and test.parquet")
    args = parser.parse_args(argv)
    import pandas as pd

    args.out.mkdir(parents=True, exist_ok=True)
    for split, path in (("train", args.train), ("test", args.test)):
        if not path.is_file():
            print(f"error: {path} does not exist", file=sys.stderr)
            return 2
        rows = to_verl(read_rows(path), split, path)
        pd.DataFrame(rows).to_parquet(args.out / f"{split}.parquet")
        print(f"{split}: {len(rows)} rows -> {args.out / f'{split}.parquet'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
