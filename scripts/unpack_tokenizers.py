"""Unpack the tokenizer fixtures (tests/fixtures/tokenizers/*.tar.xz) into build/tokenizers/<name>/.

Each archive holds one top-level folder named like the archive. A folder is (re-)extracted only when it is
missing or was extracted from other archive bytes, tracked by a stamp file inside it that holds the archive's
SHA-256 (not its mtime: a fresh checkout or worktree has new mtimes and the same archives, and re-extracting under
a running test breaks it). Concurrent callers (pytest-xdist workers, a demo beside the tests) take a lock, so one
extracts and the others wait. Standard library only.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import sys
import tarfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
ARCHIVE_DIR = REPO_ROOT / "tests" / "fixtures" / "tokenizers"
DEFAULT_DEST = REPO_ROOT / "build" / "tokenizers"
STAMP_NAME = ".unpacked"
SUFFIX = ".tar.xz"


def _extract(archive: Path, dest: Path) -> None:
    with tarfile.open(archive, "r:xz") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # Python < 3.10.12 / 3.11.4: check member paths ourselves
            root = dest.resolve()
            for member in tar.getmembers():
                target = (dest / member.name).resolve()
                if not (member.isfile() or member.isdir()) or not target.is_relative_to(root):
                    raise RuntimeError(f"unsafe member {member.name!r} in {archive}")
            tar.extractall(dest)


def ensure_unpacked(dest: Path = DEFAULT_DEST) -> dict[str, Path]:
    """Extract every fixture archive that is missing or stale under ``dest``; return name -> folder."""
    dest.mkdir(parents=True, exist_ok=True)
    result: dict[str, Path] = {}
    with open(dest / ".unpack.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        for archive in sorted(ARCHIVE_DIR.glob(f"*{SUFFIX}")):
            name = archive.name[: -len(SUFFIX)]
            target = dest / name
            stamp = target / STAMP_NAME
            digest = hashlib.sha256(archive.read_bytes()).hexdigest()
            if not stamp.is_file() or stamp.read_text().strip() != digest:
                if target.exists():
                    shutil.rmtree(target)
                _extract(archive, dest)
                if not target.is_dir():
                    raise RuntimeError(f"{archive} did not contain a top-level folder {name!r}")
                stamp.write_text(digest + "\n")
                print(f"unpacked {archive.relative_to(REPO_ROOT)} -> {target}")
            result[name] = target
    if not result:
        raise FileNotFoundError(f"no *{SUFFIX} archives in {ARCHIVE_DIR}")
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    dest = Path(args[0]) if args else DEFAULT_DEST
    ensure_unpacked(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
