"""The Makefile's environment stamps are keyed on the content of the files the environment is built from, not on
their modification times: the first `make` in a fresh clone (every file newer than any stamp) finds the .venv that
is there current, and an edit to setup.py, constraints.txt or requirements-sglang-cpu.txt rebuilds what it feeds.

Run on a scratch copy of the Makefile and those files, with a stand-in .venv (a `python` that does nothing) and
`PIP=true`, so nothing is installed anywhere."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = ("Makefile", "setup.py", "constraints.txt", "requirements-sglang-cpu.txt")

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def make(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", f"PYTHON={sys.executable}", "PIP=true", *args],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=60,
    )


def current(folder: Path, target: str) -> bool:
    """``make -q``: whether ``target`` is up to date (nothing would be rebuilt)."""
    done = make(folder, "-q", target)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode == 0


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A scratch copy with its environment built (the stand-in's stamps written by the Makefile's own recipes)."""
    for name in SOURCES:
        shutil.copy(REPO / name, tmp_path / name)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(0o755)
    built = make(tmp_path, "venv", "sglang-cpu")
    assert built.returncode == 0, built.stdout + built.stderr
    assert current(tmp_path, "venv") and current(tmp_path, "sglang-cpu")
    return tmp_path


def test_a_fresh_clone_with_newer_files_does_not_reinstall(clone: Path) -> None:
    later = time.time() + 3600  # as a clone made after the environment was built
    for name in SOURCES:
        os.utime(clone / name, (later, later))
    assert current(clone, "venv") and current(clone, "sglang-cpu")
    assert "pip" not in make(clone, "-n", "venv", "sglang-cpu").stdout  # a dry run installs nothing either


@pytest.mark.parametrize(
    ("edited", "stale"),
    [
        ("setup.py", {"venv", "sglang-cpu"}),
        ("constraints.txt", {"venv", "sglang-cpu"}),
        ("requirements-sglang-cpu.txt", {"sglang-cpu"}),
    ],
)
def test_an_edited_dependency_file_rebuilds_what_it_feeds(clone: Path, edited: str, stale: set[str]) -> None:
    with (clone / edited).open("a") as fh:
        fh.write("\n# edited\n")
    assert {t for t in ("venv", "sglang-cpu") if not current(clone, t)} == stale
    rebuilt = make(clone, "venv", "sglang-cpu")
    assert rebuilt.returncode == 0 and "true" in rebuilt.stdout, rebuilt.stderr
    assert current(clone, "venv") and current(clone, "sglang-cpu")  # the stamps now hold the new content's hash
