"""Report fixtures: record files with real Qwen3 rollouts (see report_rollouts.py) and the report built from them
by the CLI, once per session."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE.parent / "check"):  # tests/check is not a package; its builders are reused here
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


@dataclass(frozen=True)
class Built:
    records: Path
    html_path: Path
    html: str
    stdout: str
    tokenizer_dir: Path


@pytest.fixture(scope="session")
def records_file(tmp_path_factory: pytest.TempPathFactory, renderer_for: Callable[[str], Any]) -> Path:
    from report_rollouts import write_records

    return write_records(renderer_for("qwen3"), tmp_path_factory.mktemp("records"))


@pytest.fixture(scope="session")
def all_records(renderer_for: Callable[[str], Any]) -> list[Any]:
    """The records ``records_file`` holds, as typed records (built again: a test may restamp them)."""
    from report_rollouts import build_records

    return build_records(renderer_for("qwen3"))


@pytest.fixture(scope="session")
def built_report(
    records_file: Path, tmp_path_factory: pytest.TempPathFactory, tokenizer_dirs: dict[str, Path]
) -> Built:
    import contextlib
    import io

    from verl_ext.cli.main import main

    out = tmp_path_factory.mktemp("report") / "report.html"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = main(["report", str(records_file), "-o", str(out), "--tokenizer", str(tokenizer_dirs["qwen3"])])
    assert rc == 0, stdout.getvalue()
    return Built(records_file, out, out.read_text(encoding="utf-8"), stdout.getvalue(), tokenizer_dirs["qwen3"])


@pytest.fixture(scope="session")
def gateway_records(
    tiny_qwen3_dir: Path, renderer_for: Callable[[str], Any], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The gateway's records, the edited session ended as verl_ext_gateway_agent ends it (``serve_sessions``)."""
    from gateway_sessions import serve_sessions

    # the tiny model's tokenizer is Qwen3's (loaded once for the session)
    return serve_sessions(tiny_qwen3_dir, renderer_for("qwen3"), tmp_path_factory.mktemp("gateway-records"), True)


@pytest.fixture(scope="session")
def standalone_records(
    tiny_qwen3_dir: Path, renderer_for: Callable[[str], Any], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The same sessions as ``verl-ext gateway`` records them: no trainer, so no training step."""
    from gateway_sessions import serve_sessions

    return serve_sessions(tiny_qwen3_dir, renderer_for("qwen3"), tmp_path_factory.mktemp("standalone"), False)
