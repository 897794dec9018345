"""The template audit (a header's ``template_profile``) as display rows, with ids decoded to text."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.report.text import shorten

Decode = Callable[[Sequence[int]], str]


@dataclass(frozen=True)
class Tokens:
    ids: tuple[int, ...]
    text: str  # repr of the decoded ids, as ``verl-ext check-template`` prints them


@dataclass(frozen=True)
class BoundaryRow:
    where: str
    close: Tokens
    repair: Tokens
    prefix_preserving: bool
    then: str
    divergence: str


@dataclass(frozen=True)
class Audit:
    source: str
    fingerprint: str
    verdict: str
    stop_ids: list[dict[str, Any]]  # text, id, alias, sources
    generation_prompt: Tokens
    boundaries: list[BoundaryRow]
    unsupported_roles: dict[str, str]
    facts: list[tuple[str, str]]
    reasons: list[dict[str, str]]  # severity, text


def _tokens(decode: Decode, ids: Sequence[int]) -> Tokens:
    ids = tuple(int(i) for i in ids)
    return Tokens(ids, repr(decode(ids)) if ids else "(nothing)")


def audit_view(profile: dict[str, Any], decode: Decode, source: str | None = None) -> Audit:
    aliases = {int(i) for i in profile.get("alias_stop_ids") or []}
    stops = [
        {
            "text": str(s.get("text", "")),
            "id": int(s.get("id", -1)),
            "alias": int(s.get("id", -1)) in aliases,
            "sources": ", ".join(str(x) for x in s.get("sources") or []),
        }
        for s in profile.get("stop_ids") or []
    ]
    rows = []
    for b in profile.get("boundaries") or []:
        role = str(b.get("next_role", ""))
        delta = decode([int(i) for i in b.get("delta_ids") or []])
        rows.append(
            BoundaryRow(
                where="at the end" if role == "end" else f"before {role}",
                close=_tokens(decode, b.get("close_ids") or []),
                repair=_tokens(decode, b.get("trailer_ids") or []),
                prefix_preserving=bool(b.get("prefix_preserving")),
                then=repr(shorten(delta, 90)) if delta else "",
                divergence=str(b.get("divergence") or ""),
            )
        )
    grouped = {True: "grouped into one turn", False: "one turn each", None: "not renderable"}
    reasoning = {True: "stripped from earlier turns", False: "kept in history", None: "never rendered"}
    facts = [
        ("consecutive tool results", grouped.get(profile.get("consecutive_tool_results_grouped"), "?")),
        ("reasoning", reasoning.get(profile.get("strips_reasoning"), "?")),
        ("tool-call arguments", str(profile.get("tool_call_arguments", "?"))),
    ]
    if profile.get("template_kwargs"):
        facts.append(("template kwargs", json.dumps(profile["template_kwargs"], sort_keys=True)))
    return Audit(
        source=source or str(profile.get("tokenizer_name", "")),
        fingerprint=str(profile.get("fingerprint", "")),
        verdict=str(profile.get("verdict", "?")),
        stop_ids=stops,
        generation_prompt=_tokens(decode, profile.get("generation_prompt_ids") or []),
        boundaries=rows,
        unsupported_roles={str(k): str(v) for k, v in (profile.get("unsupported_roles") or {}).items()},
        facts=facts,
        reasons=[
            {"severity": str(r.get("severity", "")), "text": str(r.get("text", ""))}
            for r in profile.get("reasons") or []
        ],
    )
