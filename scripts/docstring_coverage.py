"""Count the public functions and classes of verl_ext that have a docstring, and list those that have none.

Public means: a module-level function or class, or a method of a public class, whose name does not start with an
underscore, in a module whose own path has no part starting with one (``_private.py``). Dunder methods
(``__init__``, ``__call__`` ...) are not counted; a property, classmethod or staticmethod is. Definitions nested in a
function are not counted. Counted by ``ast``, nothing is imported. Exit code 1 when the share is under ``--min``.

    python scripts/docstring_coverage.py [--min 80] [--list] [PATH ...]
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def public_definitions(tree: ast.Module) -> Iterator[tuple[str, Definition]]:
    """(qualified name, node) of each public definition of a module (see the module's doc)."""
    for node in tree.body:
        if isinstance(node, Definition) and not node.name.startswith("_"):
            yield node.name, node
            if isinstance(node, ast.ClassDef):
                for child in node.body:
                    if isinstance(child, Definition) and not child.name.startswith("_"):
                        yield f"{node.name}.{child.name}", child


def coverage(paths: list[Path]) -> tuple[int, list[str]]:
    """(how many public definitions there are, ``path:line: name`` of each without a docstring)."""
    total, missing = 0, []
    for root in paths:
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            if any(part.startswith("_") and part != "__init__.py" for part in path.relative_to(root).parts):
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for name, node in public_definitions(tree):
                total += 1
                if ast.get_docstring(node) is None:
                    missing.append(f"{path}:{node.lineno}: {name}")
    return total, missing


def main(argv: list[str] | None = None) -> int:
    """Print the share of public definitions with a docstring (and, with ``--list``, those without)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", default=["verl_ext"])
    parser.add_argument("--min", type=float, default=80.0, help="the lowest share accepted, in percent")
    parser.add_argument("--list", action="store_true", help="list every public definition without a docstring")
    args = parser.parse_args(argv)
    total, missing = coverage([Path(p) for p in args.paths])
    share = 100.0 * (total - len(missing)) / total if total else 100.0
    if args.list:
        print("\n".join(missing))
    documented = total - len(missing)
    print(f"{documented} of {total} public definitions have a docstring ({share:.1f}%; at least {args.min:g}%)")
    return 0 if share >= args.min else 1


if __name__ == "__main__":
    sys.exit(main())
