"""What a newcomer reads first says the truth and nothing internal: no paths of the build machine, no issue numbers or
notes about who else ran jobs, no package extra pip cannot resolve, the product before the benchmark tables, and a
way to run the tests without root."""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
from importlib.metadata import PackageNotFoundError, requires, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# Absolute paths of one machine (an example path in a command is written relative, e.g. build/records).
MACHINE_PATH = re.compile(r"(?<![\w.~])/(?:work|tmp|root|home|Users|opt|mnt|scratch)/")
# Internal context: the project's own issue numbers, its other jobs. Upstream references such as
# huggingface/transformers#45488 name a public thread and stay.
INTERNAL = re.compile(r"(?i)\bissues? \d+|\bissue's\b|(?<![\w/])#\d+|other agents|agents' jobs")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_docs_name_no_machine_paths_and_no_internal_context(doc):
    found = []
    for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1):
        for pattern in (MACHINE_PATH, INTERNAL):
            found += [f"{doc.name}:{n}: {m.group(0)!r} in {line.strip()[:100]!r}" for m in pattern.finditer(line)]
    assert not found, "\n".join(found)


def test_every_extra_of_setup_py_resolves():
    """Each extra's requirements are installed in the test environment (`make test` installs `.[test]`), so pip
    resolves them together with verl; an extra that cannot resolve (sglang 0.5.12 beside verl 0.9.1) is not offered."""
    tree = ast.parse((REPO / "setup.py").read_text(encoding="utf-8"))
    setup_call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
    extras = ast.literal_eval(next(k.value for k in setup_call.keywords if k.arg == "extras_require"))
    assert extras, "setup.py has no extras_require"
    for extra, requirements in extras.items():
        for text in requirements:
            unmet = _unmet(Requirement(text))
            assert not unmet, f"extra {extra!r}: {text} does not resolve beside verl_ext's requirements: {unmet}"


def _unmet(req: Requirement) -> list[str]:
    """What of ``req`` and of its own requirements (one level down) the installed environment does not satisfy."""
    try:
        installed = version(req.name)
    except PackageNotFoundError:
        return [f"{req.name} is not installed"]
    if not req.specifier.contains(installed, prereleases=True):
        return [f"{req.name} {installed} is installed"]
    unmet = []
    for dep_text in requires(req.name) or []:
        dep = Requirement(dep_text)
        if dep.marker is not None and not dep.marker.evaluate({"extra": ""}):
            continue
        try:
            dep_installed = version(dep.name)
        except PackageNotFoundError:
            unmet.append(f"{req.name} needs {dep}, not installed")
            continue
        if not dep.specifier.contains(dep_installed, prereleases=True):
            unmet.append(f"{req.name} needs {dep}, {dep.name} {dep_installed} is installed")
    return unmet


def test_the_readme_shows_the_product_before_the_figures():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    product = readme.index("## What it does")
    tables = [m.start() for m in re.finditer(r"^\| tokenizer \|", readme, re.MULTILINE)]
    assert all(t > product for t in tables), "a benchmark table comes before 'What it does'"
    for heading in ("## Demo timing", "## Per-turn bookkeeping"):
        assert heading not in readme[:product], f"{heading} comes before 'What it does'"
    performance = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
    assert "## Demo timing" in performance and "## Per-turn bookkeeping" in performance
    assert "docs/performance.md" in readme


def test_the_readme_says_how_to_run_the_tests_without_root():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "needs root" in readme and "make test VERL_EXT_REQUIRE_BROWSER=0" in readme


def test_the_browser_test_skips_when_told_not_to_require_it(monkeypatch, tmp_path):
    """The non-root path the README states: VERL_EXT_REQUIRE_BROWSER=0 skips the browser test, =1 fails it."""
    spec = importlib.util.spec_from_file_location("browser_test", REPO / "tests" / "report" / "test_report_browser.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(shutil, "which", lambda name: None)  # a machine without chromium
    monkeypatch.setenv("VERL_EXT_REQUIRE_BROWSER", "0")
    with pytest.raises(pytest.skip.Exception):
        module.chromium()
    monkeypatch.setenv("VERL_EXT_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception):
        module.chromium()


def test_the_check_page_lists_every_cause_with_its_kind():
    """docs/check.md's cause table has one row per ``Cause`` (a rule's extra row is marked "(rule)"), each saying
    "yes" for a cause allowed by design and "**defect**" for a defect, as the cause's own record says."""
    from verl_ext.check.findings import Cause, CauseKind

    page = (REPO / "docs" / "check.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)` \| (yes|\*\*defect\*\*) \|", page, re.MULTILINE)
    drawn = {name: kind for name, kind in rows}
    assert len(drawn) == len(rows), "a cause has two rows in docs/check.md"
    expected = {c.value: "yes" if c.kind is CauseKind.ALLOWED else "**defect**" for c in Cause}
    wrong = {
        k: (drawn.get(k), expected.get(k)) for k in drawn.keys() | expected.keys() if drawn.get(k) != expected.get(k)
    }
    assert not wrong, f"cause: (docs/check.md, Cause's kind): {wrong}"


def _readme_layout() -> str:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Layout") :]
    return section[section.index("```text") : section.index("```", section.index("```text") + 7)]


# The packages whose layout lists every module (the token core and the check: where a newcomer reads the contract).
LISTED_BY_MODULE = ("core", "check")


def test_the_readme_layout_names_every_package_and_every_core_and_check_module():
    """A package folder of verl_ext missing from the README's layout (or a core or check module, which the layout
    lists one by one) is what a newcomer met: the layout said less than ``ls verl_ext/*/``."""
    layout = _readme_layout()
    packages = sorted(p.name for p in (REPO / "verl_ext").iterdir() if (p / "__init__.py").is_file())
    missing = [f"verl_ext/{name}/" for name in packages if f"\n  {name}/ " not in layout]
    for name in LISTED_BY_MODULE:
        folder = REPO / "verl_ext" / name
        names = [p.name for p in folder.glob("*.py") if p.name != "__init__.py"]
        names += [f"{p.name}/" for p in folder.iterdir() if (p / "__init__.py").is_file()]
        missing += [f"verl_ext/{name}/{n}" for n in sorted(names) if not re.search(rf"\n {{4}}{re.escape(n)} ", layout)]
    assert packages and not missing, f"README.md's layout does not name: {missing}"


# A page a documented command writes: `-o NAME.html` or `--html NAME.html`, NAME without a folder (the checkout).
WRITTEN_PAGE = re.compile(r"(?:\s-o|--html)\s+([\w.-]+\.html)\b")


def test_what_the_docs_write_in_the_checkout_is_ignored_by_git():
    """The pages the docs' commands write into the checkout (`verl-ext report -o report.html`, ...) and the `.venv`
    a user links there (a symlink, not a folder) are ignored: `git status` stays clean after following the docs."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    pages = {m.group(1) for doc in DOCS for m in WRITTEN_PAGE.finditer(doc.read_text(encoding="utf-8"))}
    assert "report.html" in pages, "the README's `verl-ext report ... -o report.html` was not found"
    paths = sorted(pages | {".venv"})
    done = subprocess.run(
        ["git", "check-ignore", "--no-index", "--verbose", "--non-matching", *paths],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    not_ignored = [line.split("\t")[-1] for line in done.stdout.splitlines() if line.startswith("::")]
    assert done.returncode in (0, 1) and not not_ignored, f"not ignored by .gitignore: {not_ignored} {done.stderr}"
