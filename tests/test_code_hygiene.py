"""The code's own contracts stay written down: at least 80% of verl_ext's public functions and classes have a
docstring (counted by ``ast``, scripts/docstring_coverage.py), and no function is over 70 lines without a ``# long:``
comment above it saying why it stays in one piece (scripts/long_functions.py), and no module of verl_ext is over 800
lines (a file that grows past it holds several ideas: split it by idea)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MIN_DOCSTRINGS = 80.0
MAX_LINES = 70
MAX_FILE_LINES = 800


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=120, check=False)


def test_public_definitions_are_documented():
    done = run_script("scripts/docstring_coverage.py", "--min", str(MIN_DOCSTRINGS), "--list", "verl_ext")
    share = re.search(r"(\d+) of (\d+) public definitions have a docstring \(([\d.]+)%", done.stdout)
    assert share, done.stdout + done.stderr
    documented, total, percent = int(share.group(1)), int(share.group(2)), float(share.group(3))
    assert total > 400  # the count covers the whole package, not an empty folder
    assert percent >= MIN_DOCSTRINGS and done.returncode == 0, f"{documented}/{total}:\n{done.stdout}"


def test_no_function_is_over_70_lines_without_a_reason():
    done = run_script("scripts/long_functions.py", "--limit", str(MAX_LINES), "verl_ext")
    assert done.returncode == 0 and not done.stdout, f"write a '# long:' reason above, or split:\n{done.stdout}"


def long_files(root: Path) -> list[str]:
    """Every ``.py`` file under ``root`` over ``MAX_FILE_LINES`` lines, one line each."""
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_FILE_LINES:
            found.append(f"{path.relative_to(root.parent)}: {lines} lines")
    return found


def test_no_module_is_over_800_lines():
    found = long_files(REPO / "verl_ext")
    assert not found, f"split each by idea (at most {MAX_FILE_LINES} lines):\n" + "\n".join(found)


def test_the_file_size_scan_finds_a_long_file(tmp_path):
    """The check above can fail: a file one line over the limit is found, one at the limit is not."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "long.py").write_text("x = 1\n" * (MAX_FILE_LINES + 1))
    (pkg / "at_limit.py").write_text("x = 1\n" * MAX_FILE_LINES)
    assert long_files(pkg) == [f"pkg/long.py: {MAX_FILE_LINES + 1} lines"]


def test_both_scripts_find_what_they_look_for(tmp_path):
    """The checks above can fail: an undocumented public function and a long function without a reason are found,
    a documented one, a private one and a long one with a reason are not."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    source = tmp_path / "sample.py"
    source.write_text(
        f"def long_one():\n{body}\n\n\n"
        f"# long: one table, read top to bottom\ndef long_with_reason():\n{body}\n\n\n"
        'def documented():\n    """Has one."""\n\n\ndef _private():\n    pass\n',
        encoding="utf-8",
    )
    long = run_script("scripts/long_functions.py", "--limit", str(MAX_LINES), str(source))
    assert long.returncode == 1 and "long_one is 71 lines" in long.stdout and "long_with_reason" not in long.stdout
    docs = run_script("scripts/docstring_coverage.py", "--min", "80", "--list", str(source))
    assert docs.returncode == 1, docs.stdout
    assert "1 of 3 public definitions have a docstring (33.3%" in docs.stdout
    assert "long_one" in docs.stdout and "_private" not in docs.stdout


def test_no_import_cycle_and_nothing_imports_up():
    """scripts/import_layers.py walks every import of verl_ext (in functions too): no cycle, and each layer imports
    only itself and the layers below it (docs/architecture.md, "Layers")."""
    done = run_script("scripts/import_layers.py", "verl_ext")
    assert done.returncode == 0 and not done.stdout, f"break the cycle or move the code down a layer:\n{done.stdout}"


def test_the_import_walk_finds_a_cycle_and_an_upward_import_in_a_function(tmp_path):
    """The check above can fail: a lower layer importing a higher one inside a function is both an upward import and
    (with the higher one importing it back) a cycle; an import under ``if TYPE_CHECKING:`` is neither."""
    pkg = tmp_path / "pkg"
    for folder in ("core", "plugin", "check"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "low.py").write_text("def policy():\n    from pkg.plugin import high\n    return high\n")
    (pkg / "plugin" / "high.py").write_text("from pkg.core.low import policy\n")
    (pkg / "check" / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.plugin import high\n"
    )
    done = run_script("scripts/import_layers.py", str(pkg))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "import cycle: pkg.core.low -> pkg.plugin.high" in done.stdout
    assert "upward import: pkg.core.low (core) imports pkg.plugin.high (plugin)" in done.stdout
    assert "typed" not in done.stdout


def test_the_architecture_page_draws_the_layers_the_import_walk_holds():
    """docs/architecture.md's layer table lists verl_ext's packages lowest first, in import_layers.py's order."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from import_layers import LAYERS
    finally:
        sys.path.remove(str(REPO / "scripts"))
    page = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    table = page[page.index("## Layers") : page.index("```mermaid", page.index("## Layers"))]
    drawn = re.findall(r"^\| [^|]+ \| `verl_ext/(\w+)` \|", table, re.MULTILINE)
    assert tuple(drawn) == LAYERS, f"docs/architecture.md draws {drawn}, the import walk holds {LAYERS}"
