"""The report's fix texts name only commands and options that exist: each `verl-ext ...` command in a fix parses with
the CLI's own argparse, and every `--option` a fix names is part of such a command (a bare `--stop` names no tool)."""

from __future__ import annotations

import re
import shlex

import pytest

from verl_ext.cli.main import build_parser
from verl_ext.report import fixes

TEXTS = {
    **{f"cause {k}": v for k, v in fixes.CAUSE_FIXES.items()},
    **{f"engine {k}": v for k, v in fixes.ENGINE_FIXES.items()},
    "truncation": fixes.TRUNCATION_FIX,
    "skipped": fixes.SKIPPED_FIX,
    "generic": fixes.GENERIC_FIX,
}
COMMAND = re.compile(r"`(verl-ext [^`]+)`")


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_every_command_and_option_a_fix_names_exists(name: str) -> None:
    text = TEXTS[name]
    commands = COMMAND.findall(text)
    for command in commands:
        try:
            build_parser().parse_args(shlex.split(command)[1:])
        except SystemExit:
            pytest.fail(f"fix for {name} names `{command}`, which verl-ext's argparse refuses")
    outside = COMMAND.sub("", text)
    stray = re.findall(r"(?<![\w-])--[a-z][\w-]*", outside)
    assert not stray, f"fix for {name} names {stray} outside a `verl-ext ...` command: which tool takes it?"
