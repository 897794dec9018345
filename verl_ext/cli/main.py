"""``verl-ext``: audit a chat template before training, replay recorded rollouts token by token, report on the
consistency check's records, serve a harness through the token-keeping gateway, and run the CPU demo of verl's GRPO
trainer with verl_ext switched on."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from typing import NoReturn

from verl_ext import __version__

# Nothing heavy at module level: `verl-ext --help` and `--version` must not wait for transformers (each command
# imports what it needs once the arguments are parsed).


class UsageError(Exception):
    """A command line argparse cannot read: ``main`` prints it as one line (argparse's usage block is ``--help``'s)."""


class _Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are one line naming the problem, the closest option or command where one is
    close, and ``--help`` (argparse itself prints its usage block and exits)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message}{_closest(self, message)} (see `{self.prog} --help`)")


def _closest(parser: argparse.ArgumentParser, message: str) -> str:
    """ ", did you mean '--json'?" for an unrecognised option or an invalid command close to a known one."""
    import difflib

    choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)", message)
    if choice:
        word, known = choice[1], re.findall(r"'([^']*)'", choice[2])
    else:
        unknown = re.search(r"unrecognized arguments: (\S+)", message)
        if not unknown or not unknown[1].startswith("-"):
            return ""
        word, known = unknown[1].split("=", 1)[0], _option_strings(parser)
    close = difflib.get_close_matches(word, known, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    """Every option of ``parser`` and of its subcommands (argparse names an unknown option at the top level)."""
    out: list[str] = []
    for action in parser._actions:
        out += action.option_strings
        for sub in getattr(action, "choices", None) or {}:
            if isinstance(action.choices, dict) and isinstance(action.choices[sub], argparse.ArgumentParser):
                out += _option_strings(action.choices[sub])
    return sorted(set(out))


def build_parser() -> argparse.ArgumentParser:
    """The ``verl-ext`` argument parser: check-template, replay, report, demo."""
    parser = _Parser(prog="verl-ext", description=__doc__)
    parser.add_argument("--version", action="version", version=f"verl-ext {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    check = sub.add_parser("check-template", help="derive a template's turn boundaries and give a verdict")
    check.add_argument("tokenizer_dir", help="folder with tokenizer.json and tokenizer_config.json")
    _add_template_options(check)
    check.add_argument(
        "--template-kwargs",
        metavar="JSON",
        help="a JSON object passed to the chat template, as your rollout passes it "
        "(e.g. '{\"enable_thinking\": false}')",
    )
    check.add_argument("--json", action="store_true", help="print one JSON object (key 'verdict' and the findings)")
    check.add_argument("--html", metavar="FILE", help="also write the audit as a self-contained HTML page")

    rep = sub.add_parser("replay", help="rebuild recorded conversations as a rollout would and check invariants")
    rep.add_argument(
        "files",
        nargs="+",
        metavar="FILE",
        help="JSONL files, one record per line (see docs/replay-format.md); a multi-worker run writes one per process",
    )
    rep.add_argument("--tokenizer", required=True, help="tokenizer folder")
    _add_template_options(rep)
    rep.add_argument("--json", action="store_true", help="print a JSON array, one object per record")
    rep.add_argument("--tokens", action="store_true", help="print every token, not one line per segment")

    report = sub.add_parser("report", help="write the consistency check's records as one self-contained HTML page")
    report.add_argument("records", nargs="+", metavar="RECORDS.jsonl", help="record files the check wrote")
    report.add_argument("-o", "--output", required=True, metavar="FILE", help="the HTML file to write")
    report.add_argument(
        "--tokenizer", metavar="DIR", help="tokenizer folder to decode ids (default: the one the header names)"
    )
    report.add_argument("--examples", type=int, default=5, metavar="N", help="worst rollouts shown token by token")
    report.add_argument(
        "--chat-template",
        metavar="FILE",
        help="the .jinja chat template the run used, when it was not the tokenizer folder's (records from before "
        "the tokenizer fingerprint was written are compared by tokenizer and template)",
    )

    from verl_ext.cli.gateway import add_gateway_parser

    add_gateway_parser(sub)

    _add_demo_parser(sub)
    return parser


def _add_demo_parser(sub: argparse._SubParsersAction) -> None:
    """`verl-ext demo`'s options."""
    demo = sub.add_parser(
        "demo",
        help="run verl's GRPO trainer on CPU with verl_ext (a tiny random Qwen3 or Qwen2.5-VL), print tito/ metrics, "
        "write the report",
    )
    demo.add_argument("--out", default="build/demo", metavar="DIR", help="where the model, data, log and report go")
    demo.add_argument("--steps", type=int, default=2, help="GRPO steps (default 2)")
    demo.add_argument(
        "--trainer",
        choices=("v1", "v0", "colocate-async"),
        default="v1",
        help="verl's v1 trainer (TransferQueue, trainer.v1.trainer_mode=sync), its v0 trainer, or the v1 trainer's "
        "colocate_async mode (trainer.v1.trainer_mode=colocate_async: partial rollouts, each request in flight at a "
        "weight update resumed on the new weights; docs/async.md)",
    )
    demo.add_argument(
        "--loop",
        choices=("tool", "gateway", "all"),
        default="tool",
        help="tool: verl_ext_tool_agent (default); gateway: verl_ext_gateway_agent running the demo's harness (a ReAct "
        "agent on the openai SDK, verl_ext/demo/harness.py) through the gateway; all: rows name verl_ext_tool_agent, "
        "verl_ext_audited_tool_agent and verl_ext_gateway_agent in turn (agent_name; v1 trainers)",
    )
    demo.add_argument(
        "--model",
        choices=("qwen3", "qwen2.5-vl"),
        default="qwen3",
        help="qwen3: a tiny random Qwen3 with the calculator tool (default); qwen2.5-vl: a tiny random Qwen2.5-VL with "
        "the screenshot tool, an image in every prompt and tool result (with --loop tool)",
    )
    demo.add_argument(
        "--bypass",
        action="store_true",
        help="verl's bypass mode (algorithm.rollout_correction.bypass_mode): no old-logprob pass; the numerics view "
        "measures inside the policy loss",
    )
    demo.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="extra Hydra overrides for verl's trainer")


def _add_template_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--chat-template", metavar="FILE", help="a .jinja chat template to use instead of the tokenizer's")
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TOKEN",
        help="an extra stop token the engine is configured with (a token string such as '</tool_call>', or an id)",
    )


def _run(args: argparse.Namespace) -> int:
    if args.command == "check-template":
        from verl_ext.cli.check_template import run_check_template

        return run_check_template(args)
    if args.command == "demo":
        from verl_ext.cli.demo import run_demo_command

        return run_demo_command(args)
    if args.command == "report":
        from verl_ext.cli.report import run_report

        return run_report(args)
    if args.command == "gateway":
        from verl_ext.cli.gateway import run_gateway

        return run_gateway(args)
    from verl_ext.cli.replay import run_replay

    return run_replay(args)


def _stdout_closed() -> int:
    """The reader went away (`verl-ext replay ... --tokens | head`): stop quietly, as a shell tool does. Point
    stdout at /dev/null so the interpreter's final flush does not raise again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 141  # 128 + SIGPIPE, what the shell reports for a tool killed by the closed pipe


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``verl-ext`` with ``argv``; returns the exit code (2 with one line on stderr for a user error)."""
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    from verl_ext.core.errors import VerlExtError

    try:
        code = _run(args)
        sys.stdout.flush()  # a closed pipe surfaces here, inside the handler, not at interpreter exit
        return code
    except BrokenPipeError:
        return _stdout_closed()
    except (VerlExtError, OSError, ValueError) as exc:  # user error: one line, exit code 2
        print(f"verl-ext {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
