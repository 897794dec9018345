"""``verl-ext report``: record files in, one self-contained HTML page out."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from verl_ext.cli.options import check_output_file, distinct_files
from verl_ext.core.errors import OptionsError
from verl_ext.core.rendering import ChatRenderer, load_renderer
from verl_ext.report import build_report, write_html
from verl_ext.report.load import Records, load_records


def _renderer(args: argparse.Namespace, records: Records) -> ChatRenderer:
    """Records hold token ids only; the tokenizer turns them back into text. The header names the folder the
    rollouts used, which is the right one when the report is built on the training host."""
    if args.tokenizer:
        return load_renderer(args.tokenizer, chat_template_file=args.chat_template)
    names = {p.tokenizer_name for p in records.profiles if p.tokenizer_name}
    for name in sorted(names):
        if Path(name).is_dir():
            return load_renderer(name, chat_template_file=args.chat_template)
    named = (
        f"the records name {', '.join(repr(n) for n in sorted(names))}, which is not a folder here"
        if names
        else ("the records have no header naming their tokenizer")
    )
    raise OptionsError(f"no tokenizer to decode the records' token ids: {named}; pass --tokenizer DIR")


def check_same_tokenizer(renderer: ChatRenderer, records: Records) -> None:
    """Refuse a tokenizer other than the one each header names (its tokenizer fingerprint; headers from before it
    was written: the fingerprint of tokenizer, chat template and template kwargs, as replay compares): another
    model's tokenizer decodes the ids to other text, and its smaller vocabulary turns ids into invented
    engine-view failures."""
    for profile in records.profiles:
        if profile.tokenizer_fingerprint:
            mine, theirs, what, fix = renderer.tokenizer_fingerprint, profile.tokenizer_fingerprint, "tokenizer", ""
        elif profile.fingerprint:
            mine = renderer.with_template_kwargs(dict(profile.template_kwargs)).fingerprint
            theirs, what = profile.fingerprint, "tokenizer and chat template (older records)"
            fix = " (and --chat-template FILE, for a run with another template than the folder's)"
        else:
            continue  # a header from before any fingerprint was written: nothing to compare
        if mine != theirs:
            raise OptionsError(
                f"the records were written with tokenizer {profile.tokenizer_name!r} (fingerprint of the {what}: "
                f"{theirs}), not with {renderer.name!r} ({mine}): its ids would decode to other text and ids outside "
                f"its vocabulary would show as engine-view failures. Pass --tokenizer the folder the rollouts used{fix}"
            )


def run_report(args: argparse.Namespace) -> int:
    if args.examples < 0:
        raise OptionsError(f"--examples must be 0 or more, got {args.examples}")
    check_output_file(args.output, "-o")  # before the slow part, so a typo costs nothing
    records = load_records(distinct_files(args.records, "report"))
    renderer = _renderer(args, records)
    check_same_tokenizer(renderer, records)
    report = build_report(records, renderer.decode, examples=args.examples, vocab_size=renderer.vocab_size)
    out = write_html(args.output, report.html)
    for warning in report.warnings:
        print(f"verl-ext report: warning: {warning}", file=sys.stderr)
    print(f"wrote {out}: {report.summary.one_line()}")
    if report.images is not None:
        print(report.images.line())
    return 0
