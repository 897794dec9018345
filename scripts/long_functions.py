"""List the functions of verl_ext longer than a limit (default 60 lines) that have no reason written next to them.

A reason is a comment line starting with ``# long:`` right above the ``def`` (or its decorators), saying why the
function stays in one piece. Exit code 1 when any function is listed, so the check can run in CI.

    python scripts/long_functions.py [--limit 60] [PATH ...]
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path


def long_functions(path: Path, limit: int) -> list[tuple[int, str, int]]:
    """(line, name, length) of each function in ``path`` over ``limit`` lines without a ``# long:`` reason."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    out = []
    for node in ast.walk(ast.parse(text, str(path))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        above = lines[first - 2].strip() if first >= 2 else ""
        if length > limit and not above.startswith("# long:"):
            out.append((node.lineno, node.name, length))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=["verl_ext"])
    parser.add_argument("--limit", type=int, default=60)
    args = parser.parse_args(argv)
    found = 0
    for root in map(Path, args.paths):
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            for line, name, length in long_functions(path, args.limit):
                print(f"{path}:{line}: {name} is {length} lines")
                found += 1
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
