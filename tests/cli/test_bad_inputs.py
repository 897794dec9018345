"""The new user's bad command lines and ``verl_ext`` options (the corpus in tests/bad_inputs.py), each run in
process: ``verl-ext`` through its ``main``, an option through what reads it. Every answer is one line naming the
problem and the fix, with no traceback and no Python repr, and the exit code the entry says."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from bad_inputs import BAD_FILES, CLI, FIX_WORDS, NOT_FOR_USERS, OPTIONS, Cli, Option, Scratch

from verl_ext.cli.main import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def scratch(
    tmp_path_factory: pytest.TempPathFactory, tokenizer_dirs: dict[str, Path], renderer_for: Callable[[str], Any]
) -> tuple[Scratch, Path]:
    """The scratch folder with a good record file (real Qwen3 rollouts, tests/report/report_rollouts.py) whose lines
    the bad files are built from."""
    sys.path.insert(0, str(REPO / "tests" / "report"))
    from report_rollouts import write_records

    records = write_records(renderer_for("qwen3"), tmp_path_factory.mktemp("records"))
    tmp = tmp_path_factory.mktemp("bad-inputs")
    return Scratch(tmp, records.read_text().splitlines(), tokenizer_dirs), records


def assert_one_clear_line(text: str, says: tuple[str, ...], what: object) -> None:
    lines = text.strip().splitlines()
    assert len(lines) == 1, (what, text)
    assert not NOT_FOR_USERS.search(text), (what, text)
    for words in says:
        assert words in text, (what, words, text)
    assert FIX_WORDS.search(text), ("no fix named", what, text)


@pytest.mark.parametrize("case", CLI, ids=[c.args or "(nothing)" for c in CLI])
def test_a_bad_command_line_gets_one_clear_line(
    case: Cli, scratch: tuple[Scratch, Path], tiny_qwen3_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    where, records = scratch
    fill = {
        "qwen3": str(where.tokenizers["qwen3"]),
        "mistral": str(where.tokenizers["mistral-7b-v0.3"]),
        "tiny": str(tiny_qwen3_dir),
        "tmp": str(where.tmp),
        "records": str(records),
    }
    argv = []
    for word in shlex.split(case.args):
        for name, builder in BAD_FILES.items():
            if "{bad:" + name + "}" in word:
                word = word.replace("{bad:" + name + "}", str(builder(where)))
        for name, value in fill.items():
            word = word.replace("{" + name + "}", value)
        argv.append(word)
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == case.code, (argv, out, err)
    assert_one_clear_line(err, case.says, argv)
    assert out == "", (argv, out)


def _refusal(case: Option) -> str:
    """The OptionsError ``LoopOptions`` (or Hydra's override check) raises for the entry, as text."""
    from verl_ext.core.errors import OptionsError
    from verl_ext.plugin.options import LoopOptions
    from verl_ext.plugin.overrides import check_overrides, check_verl_ext_overrides

    with pytest.raises(OptionsError) as refused:
        if case.override is not None:
            check_overrides([case.override])
            check_verl_ext_overrides([case.override])
        else:
            from omegaconf import OmegaConf

            LoopOptions.from_sources(OmegaConf.create(case.yaml).get("verl_ext"))
    return str(refused.value)


@pytest.mark.parametrize("case", OPTIONS, ids=[c.override or c.yaml or "" for c in OPTIONS])
def test_a_bad_option_gets_one_clear_line(case: Option) -> None:
    assert_one_clear_line(_refusal(case), case.says, case)


def test_the_corpus_covers_every_surface() -> None:
    """At least the new user's 153 inputs, over every subcommand and every options section."""
    from bad_inputs import HTTP

    assert len(CLI) + len(OPTIONS) + len(HTTP) >= 153
    commands = {shlex.split(c.args)[0] for c in CLI if c.args}
    assert commands == {"check-template", "chek-template", "gateway", "report", "replay", "demo"}
    sections = {
        (c.override or c.yaml or "").replace("+", "").split("=")[0].split(".")[1:2][0] for c in OPTIONS if c.override
    }
    assert {"check", "records", "harness", "numerics", "extra_stop_tokens", "tool_timeout_s"} <= sections
