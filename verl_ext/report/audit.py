"""The template audit (a header's ``template_profile``) as display rows, with ids decoded to text."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verl_ext.check.record_header import HeaderProfile
from verl_ext.report.text import shorten

Decode = Callable[[Sequence[int]], str]


def as_typed(folder: str) -> str:
    """A folder the header names, as a person here would type it: relative to the working folder when it lies inside
    it (the demo's build/demo/tiny-qwen3, which the trainer was given as an absolute path), else as it is."""
    path = Path(folder)
    if path.is_absolute():
        try:
            return str(path.relative_to(Path.cwd()))
        except ValueError:
            pass
    return folder


@dataclass(frozen=True)
class Tokens:
    """Ids and their decoded text, as the audit shows them."""

    ids: tuple[int, ...]
    text: str  # repr of the decoded ids, as ``verl-ext check-template`` prints them


@dataclass(frozen=True)
class BoundaryRow:
    """One row of the audit's boundary table: what the template renders after an assistant turn."""

    where: str
    close: Tokens
    repair: Tokens
    prefix_preserving: bool
    then: str
    divergence: str


@dataclass(frozen=True)
class Audit:
    """The template audit as the report's page shows it."""

    source: str
    fingerprint: str
    verdict: str
    stop_ids: list[dict[str, Any]]  # text, id, alias, sources
    generation_prompt: Tokens
    boundaries: list[BoundaryRow]
    unsupported_roles: dict[str, str]
    facts: list[tuple[str, str]]
    reasons: list[dict[str, str]]  # severity, text


@dataclass(frozen=True)
class ReaderSection:
    """The audit's tool-call reader section: which reader serves the template, the form derived from it, a probe
    render of calls, the calls and the content read back from it, and the verdict on that read-back."""

    serves: str  # which reader serves the template (verl's, the derived one, none and why)
    form: str  # the derived form in words ("" where none was derived)
    example: str  # repr of the probe's render of calls
    calls: list[str]  # the calls read back, NAME({...}) each
    content: str  # repr of the content read back
    verdict: str  # "reads back" or "FAILS: why"
    failed: bool


def _tokens(decode: Decode, ids: Sequence[int]) -> Tokens:
    ids = tuple(int(i) for i in ids)
    return Tokens(ids, repr(decode(ids)) if ids else "(nothing)")


def audit_view(profile: HeaderProfile, decode: Decode, source: str | None = None) -> Audit:
    """The audit rows of ``profile`` (a record header's ``RecordHeader.profile``, or ``HeaderProfile.of`` a probe's
    profile), ids decoded by ``decode``; ``source`` names the template (default: the profile's tokenizer)."""
    aliases = set(profile.alias_stop_ids)
    stops = [
        {"text": s.text, "id": s.id, "alias": s.id in aliases, "sources": ", ".join(s.sources)}
        for s in profile.stop_ids
    ]
    rows = []
    for b in profile.boundaries:
        delta = decode(b.delta_ids)
        rows.append(
            BoundaryRow(
                where="at the end" if b.next_role == "end" else f"before {b.next_role}",
                close=_tokens(decode, b.close_ids),
                repair=_tokens(decode, b.trailer_ids),
                prefix_preserving=b.prefix_preserving,
                then=repr(shorten(delta, 90)) if delta else "",
                divergence=b.divergence,
            )
        )
    grouped = {True: "grouped into one turn", False: "one turn each", None: "not renderable"}
    reasoning = {True: "stripped from earlier turns", False: "kept in history", None: "never rendered"}
    facts = [
        ("consecutive tool results", grouped[profile.consecutive_tool_results_grouped]),
        ("reasoning", reasoning[profile.strips_reasoning]),
        ("tool-call arguments", profile.tool_call_arguments),
    ]
    if profile.template_kwargs:
        facts.append(("template kwargs", json.dumps(profile.template_kwargs, sort_keys=True)))
    return Audit(
        source=as_typed(source or profile.tokenizer_name),
        fingerprint=profile.fingerprint,
        verdict=profile.verdict,
        stop_ids=stops,
        generation_prompt=_tokens(decode, profile.generation_prompt_ids),
        boundaries=rows,
        unsupported_roles=dict(profile.unsupported_roles),
        facts=facts,
        reasons=[{"severity": r.severity, "text": r.text} for r in profile.reasons],
    )
