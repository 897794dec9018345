"""Shared fixtures: the real tokenizers shipped as tests/fixtures/tokenizers/*.tar.xz, loaded offline."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from verl_ext.demo.run import shipped_tokenizers

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "tests" / "fixtures"

# Modules that start Ray (verl's trainer, a Ray cluster, ray.init) carry ``pytest.mark.xdist_group("ray")``: `make
# test` runs `pytest -n 2 --dist loadgroup`, so they run one after another on one worker. Two Ray sessions at once
# on two cores would only slow each other, and a ray.init() could join a cluster another module started.


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Moves the Ray group's tests first: the group is the longest unit of work, so it starts at once on one worker
    while the other takes everything else."""
    items.sort(key=lambda item: not any(m.args[:1] == ("ray",) for m in item.iter_markers("xdist_group")))  # stable


# Seconds each xdist worker spent in tests (setup + call + teardown), the Ray group's apart: printed at the end so a
# CI log shows which worker is the critical path of the 30-minute budget.
_BUSY: defaultdict[tuple[str, bool], float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)
    worker = getattr(getattr(node, "gateway", None), "id", "main")
    _BUSY[worker, "@ray" in report.nodeid] += report.duration


def pytest_terminal_summary(terminalreporter: Any) -> None:
    workers = sorted({w for w, _ in _BUSY})
    for w in workers:
        total, ray = _BUSY[w, False] + _BUSY[w, True], _BUSY[w, True]
        terminalreporter.write_line(f"worker {w}: {total:.0f} s in tests, of which the Ray group {ray:.0f} s")


@pytest.fixture(scope="session")
def tokenizer_dirs() -> dict[str, Path]:
    """name -> unpacked tokenizer folder (qwen3, qwen2.5, gpt-oss, mistral-7b-v0.3)."""
    return shipped_tokenizers()


@pytest.fixture(scope="session")
def load_tokenizer(tokenizer_dirs: dict[str, Path]) -> Callable[[str], Any]:
    """Returns ``load(name)``: the AutoTokenizer for a fixture tokenizer, loaded once per session."""
    cache: dict[str, Any] = {}

    def load(name: str) -> Any:
        if name not in cache:
            from transformers import AutoTokenizer

            os.environ["HF_HUB_OFFLINE"] = "1"
            cache[name] = AutoTokenizer.from_pretrained(str(tokenizer_dirs[name]))
        return cache[name]

    return load


@pytest.fixture(scope="session")
def templates_dir() -> Path:
    """Folder of verbatim chat templates without a tokenizer (see its SOURCE.md)."""
    return FIXTURES / "templates"


@pytest.fixture(scope="session")
def qwen3_extra_templates(tokenizer_dirs: dict[str, Path]) -> list[Path]:
    """The Qwen3-family alternative chat templates shipped with the qwen3 tokenizer."""
    return sorted((tokenizer_dirs["qwen3"] / "extra_templates").glob("*.jinja"))


FAMILIES = ("qwen3", "qwen2.5", "gpt-oss", "mistral-7b-v0.3")


@pytest.fixture(scope="session")
def renderer_for(load_tokenizer: Callable[[str], Any]) -> Callable[[str], Any]:
    """Returns ``renderer(name)``: a ChatRenderer over a fixture tokenizer, built once per session."""
    from verl_ext.core.rendering import ChatRenderer

    cache: dict[str, Any] = {}

    def renderer(name: str) -> Any:
        if name not in cache:
            cache[name] = ChatRenderer(load_tokenizer(name))
        return cache[name]

    return renderer


@pytest.fixture(scope="session")
def tiny_qwen3_dir(tokenizer_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Qwen3-architecture model (fp32, seed 0) saved with the real Qwen3 tokenizer, built once."""
    from verl_ext.demo.model import build_tiny_qwen3

    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny-qwen3"), tokenizer_dirs["qwen3"], seed=0)


@pytest.fixture(scope="session")
def gemma_like_renderer() -> Any:
    """Gemma 2's real template over the Mistral v0.3 tokenizer given Gemma's turn markers as special tokens and,
    as Gemma's vocabulary has them, "\\n", whitespace runs and HTML tags as plain (non-special) added tokens."""
    from template_fixtures import GEMMA_PLAIN, template_renderer

    return template_renderer("google-gemma-2-2b-it", plain=GEMMA_PLAIN)
