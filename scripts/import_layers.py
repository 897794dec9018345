"""Walk a package's imports (module-level and inside functions, by ``ast``; not those under ``if TYPE_CHECKING:``)
and print every import cycle and every import from a lower layer to a higher one. Exit 1 when it prints anything.

Usage: ``python scripts/import_layers.py [PACKAGE_DIR]`` (default ``verl_ext``). The layers, lowest first, are
``LAYERS``: a module may import its own layer and the layers before it; docs/architecture.md draws the same order
(tests/test_code_hygiene.py holds the two together).
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

# verl_ext's layers, lowest first: the first part of a module's name under the package. ``verl_ext/__init__.py``
# itself is below them all (it imports nothing).
LAYERS = ("core", "check", "telemetry", "report", "runtime", "engines", "gateway", "plugin", "demo", "cli")

Graph = dict[str, set[str]]


def module_name(path: Path, root: Path) -> str:
    """``verl_ext/check/findings.py`` -> ``verl_ext.check.findings``; a package's ``__init__.py`` is the package."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import under ``node``, at any depth (functions, methods, try blocks), skipping ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _type_checking_only(child):
            yield from (i for n in child.orelse for i in _imports_of(n))
            continue
        yield from _imports_of(child)


def _imports_of(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    yield from _imports(node)


def import_graph(root: Path) -> Graph:
    """Module -> the package's modules it imports (``from a.b import c`` is ``a.b.c`` where that is a module)."""
    package = root.name
    files = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph: Graph = {}
    for name, path in files.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
                continue
            base = node.module or ""
            if node.level:
                parts = here.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names}
        graph[name] = {t for t in targets if t in files and t != name and t.split(".")[0] == package}
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan), each sorted: every import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer(module: str, layers: tuple[str, ...] = LAYERS) -> int:
    """The rank of a module's layer (-1: the package's own ``__init__``, below every layer). Raises ``ValueError``
    for a subpackage no layer names (a new one must be placed)."""
    parts = module.split(".")
    if len(parts) == 1:
        return -1
    if parts[1] not in layers:
        raise ValueError(f"{module}: {parts[1]!r} is in no layer; add it to LAYERS and to docs/architecture.md")
    return layers.index(parts[1])


def upward(graph: Mapping[str, set[str]], layers: tuple[str, ...] = LAYERS) -> list[tuple[str, str]]:
    """Every import from a module to one of a higher layer: (importer, imported)."""
    return sorted((a, b) for a, targets in graph.items() for b in targets if layer(b, layers) > layer(a, layers))


def problems(root: Path, layers: tuple[str, ...] = LAYERS) -> list[str]:
    """One line per import cycle and per upward import in the package at ``root``."""
    graph = import_graph(root)
    out = [f"import cycle: {' -> '.join(c)}" for c in cycles(graph)]
    out += [f"upward import: {a} ({a.split('.')[1]}) imports {b} ({b.split('.')[1]})" for a, b in upward(graph, layers)]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", nargs="?", default="verl_ext", help="the package folder (default verl_ext)")
    found = problems(Path(parser.parse_args().package).resolve())
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
