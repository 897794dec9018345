"""``verl-ext check-template``: the probe's findings in words, and a verdict; for a folder with a processor config
(a vision-language model), the image audit too (``verl_ext.cli.vision_audit``): exit code 1 when either is
unsupported."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import TYPE_CHECKING

from verl_ext.cli.options import check_output_file, renderer_from_args, stop_ids_from_args
from verl_ext.cli.vision_audit import audit_vision
from verl_ext.core.probe import probe_template
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.template_profile import END, TemplateProfile, Verdict
from verl_ext.core.tool_call_shape import RENDERS_ARGUMENTS, RENDERS_NAME, RENDERS_NOTHING

if TYPE_CHECKING:
    from verl_ext.plugin.tool_parser_fit import ParserFit
    from verl_ext.report.audit import ReaderSection


def run_check_template(args: argparse.Namespace) -> int:
    """Probe the template, print the audit (words or ``--json``), write ``--html``; exit code 1 when unsupported,
    or when the tool-call reader derived from the template reads its own renders wrong."""
    if args.html:
        check_output_file(args.html, "--html", example="audit.html")  # before the probe, so a wrong path costs nothing
    renderer = renderer_from_args(args.tokenizer_dir, args)
    profile = probe_template(renderer, stop_ids_from_args(renderer, args.stop))
    parsers = parser_fit(renderer, profile)
    vision = audit_vision(renderer, args.tokenizer_dir)  # None: no processor config in the folder
    if args.json:
        data = profile.to_dict()
        if parsers is not None:
            data["verl_tool_parsers"] = parsers.to_dict()
        if vision is not None:
            data["vision"] = vision.to_dict()
        print(json.dumps(data, indent=2, default=str))
    else:
        print(format_profile(renderer, profile, source=args.chat_template or args.tokenizer_dir, parsers=parsers))
        if vision is not None:
            print("\n" + "\n".join(vision.lines(renderer)))
    if args.html:
        from verl_ext.check.record_header import HeaderProfile
        from verl_ext.report.audit import audit_view
        from verl_ext.report.build import write_html
        from verl_ext.report.html import render

        audit = audit_view(HeaderProfile.of(profile), renderer.decode, source=args.chat_template or args.tokenizer_dir)
        # the audit section is the report's own; what only a live tokenizer can tell goes in a section of its own
        parser_line = parsers.summary() if parsers is not None else None
        reader = reader_section(parsers) if parsers is not None else None
        out = write_html(args.html, render("audit_page.html.j2", audit=audit, tool_parsers=parser_line, reader=reader))
        # stderr, so that --json output on stdout stays one JSON object
        print(f"wrote {out}", file=sys.stderr)
    unsupported = profile.verdict is Verdict.UNSUPPORTED or (vision is not None and vision.refused is not None)
    return 1 if unsupported or (parsers is not None and parsers.reader_failed) else 0


def parser_fit(renderer: ChatRenderer, profile: TemplateProfile) -> ParserFit | None:
    """Which of verl's tool parsers reads the template's tool calls; None for a template rollouts cannot use (its
    verdict says why) or that cannot take a tool message at all."""
    if profile.verdict is Verdict.UNSUPPORTED or "tool" in profile.unsupported_roles:
        return None
    # Importing it imports verl (and torch) and loads the plugin, whose INFO line ("verl_ext plugin loaded in pid
    # N") is for training processes: the audit prints its findings only (a failure to load, WARNING and up, shows).
    plugin_log = logging.getLogger("verl_ext.plugin")
    plugin_log.addFilter(_warnings_only)
    try:
        from verl_ext.plugin.tool_parser_fit import tool_parser_fit
    finally:
        plugin_log.removeFilter(_warnings_only)
    return tool_parser_fit(renderer, profile)


def reader_section(parsers: ParserFit) -> ReaderSection:
    """The ``--html`` audit's tool-call reader section, from the fit's derived reader."""
    from verl_ext.report.audit import ReaderSection

    derived = parsers.derived
    shown = derived is not None and (parsers.derived_reads or derived.failed)
    form = derived.reader.form.describe() if derived is not None and derived.reader is not None else ""
    verdict = "the calls rendered, and the content the template wrapped"
    return ReaderSection(
        serves=parsers.reader_line(),
        form=form,
        example=repr(derived.example) if shown and derived is not None else "",
        calls=[f"{n}({json.dumps(a)})" for n, a in derived.proof] if shown and derived is not None else [],
        content=repr(derived.content) if shown and derived is not None else "",
        verdict=f"FAILS: {derived.why}" if derived is not None and derived.failed else verdict,
        failed=parsers.reader_failed,
    )


def _warnings_only(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.WARNING


def _tok(renderer: ChatRenderer, ids: tuple[int, ...]) -> str:
    return repr(renderer.decode(ids)) if ids else "(nothing)"


# What the template renders of a tool call (``ToolCallShape.renders``), as the audit's line says it.
_RENDERS = {
    RENDERS_ARGUMENTS: "the arguments",
    RENDERS_NAME: "the name only",
    RENDERS_NOTHING: "nothing of the call (it can only live in the content text)",
}


def format_profile(renderer: ChatRenderer, p: TemplateProfile, source: str, parsers: ParserFit | None = None) -> str:
    """The audit as ``verl-ext check-template`` prints it: verdict (the verl tool parser that reads the template's
    calls, the reader that serves it, verl's or the one derived from the template, with a rendered call read back
    as proof), stop ids, boundaries, conventions, then every reason."""
    failed = "" if parsers is None or not parsers.reader_failed else "; the tool-call reader FAILS its read-back"
    lines = [f"chat template of {source} (fingerprint {p.fingerprint})", f"verdict: {p.verdict.value}{failed}"]
    if parsers is not None:
        lines.append(f"verl tool parser: {parsers.summary()}")
        lines.append(f"tool-call reader: {parsers.reader_line()}")
        lines += [f"  {line}" for line in parsers.proof_lines()]
    lines.append("")
    lines.append("stop ids an engine may end a turn on:")
    aliases = p.alias_id_set
    for s in p.stop_ids:
        role = "alias: gets a synthetic close" if s.id in aliases else "closes a turn"
        lines.append(f"  {s.text:<16} {s.id:>7}  {role:<30} ({', '.join(s.sources)})")
    lines.append(f"generation prompt: {_tok(renderer, p.generation_prompt_ids)}")
    lines.append("")
    lines.append("after an assistant turn the template renders:")
    for b in p.boundaries:
        where = "at the end" if b.next_role == END else f"before {b.next_role}"
        delta = renderer.decode(b.delta_ids)
        if len(delta) > 70:
            delta = delta[:40] + " ... " + delta[-25:]
        preserving = "yes" if b.prefix_preserving else "no"
        if b.not_preserving_with:
            preserving += f" (with {', '.join(b.not_preserving_with)})"
        lines.append(
            f"  {where:<14} close {_tok(renderer, b.close_ids):<14} repair {_tok(renderer, b.trailer_ids):<10} "
            f"prefix-preserving: {preserving}"
        )
        if b.delta_ids:
            lines.append(f"  {'':<14} then {delta!r}")
    for role, why in p.unsupported_roles.items():
        lines.append(f"  before {role:<7} cannot append: {why}")
    grouped = {True: "grouped into one turn", False: "one turn each", None: "not renderable"}
    lines.append(f"consecutive tool results: {grouped[p.consecutive_tool_results_grouped]}")
    reasoning = {True: "stripped from earlier turns", False: "kept in history", None: "never rendered"}
    lines.append(f"reasoning: {reasoning[p.strips_reasoning]}")
    lines.append(f"tool-call arguments: {p.tool_call_arguments}")
    shape = p.tool_call_shape
    lines.append(
        f"tool-call input: content {'None' if shape.content_none else repr('')}, arguments as {shape.arguments}; "
        f"the template renders {_RENDERS.get(shape.renders, shape.renders)}"
    )
    parallel = {True: "yes", False: "no, one per turn", None: "not renderable"}[p.parallel_tool_calls]
    lines.append(f"several tool calls in one turn: {parallel}")
    if p.template_kwargs:
        lines.append(f"template kwargs: {json.dumps(dict(p.template_kwargs))}")
    lines.append("")
    lines.append("reasons:" if p.reasons else "reasons: none")
    lines += [f"  [{r.severity.value}] {r.text}" for r in p.reasons]
    return "\n".join(lines)
