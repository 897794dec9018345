"""Findings at turn ends that a re-render cannot see: what the stream holds where a turn stopped.

These come from the engine record alone (no render), so they are cheap and run on every rollout:
- EOS_ALIAS: the turn stopped on a stop id the template never renders (Qwen3 ``<|endoftext|>``);
- SYNTHETIC_CLOSE: the engine did not sample the close the template renders, and the stream has it (mask 0);
- CLOSE_VARIANT: the turn stopped on another of the template's turn ends (GPT-OSS ``<|return|>`` before a user
  message, Llama ``<|eom_id|>``): kept as the turn's close;
- AMBIGUOUS_STOP_KEPT: the stop token also opens the next message (GLM ``<|observation|>``) and is kept once;
- CLOSE_MISSING: a turn followed by another message has neither a sampled nor an inserted close (a defect); not
  after a single tool call on a template that writes no close there (``Boundary.close_omitted``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from verl_ext.check.findings import Cause, Finding, Span
from verl_ext.check.locate import Locator
from verl_ext.core.errors import TemplateError
from verl_ext.core.template_profile import END, TemplateProfile


def turn_end_findings(
    loc: Locator,
    profile: TemplateProfile,
    stream: Sequence[int],
    allowed: Callable[[Cause], bool],
    messages: Sequence[Mapping[str, Any]] = (),
) -> list[Finding]:
    """A finding for each turn end that is not "the template's close, sampled": an ambiguous stop kept once, a
    close variant, an alias stop, a missing close, a synthetic close; ``allowed`` judges each cause. A turn followed
    by a role the template cannot append is skipped (the template view reports what differs there)."""
    out: list[Finding] = []
    closes = profile.close_id_set
    turn_ends = profile.turn_end_id_set
    aliases = profile.alias_id_set
    end_has_close = bool(profile.boundary(END).close_ids)
    decode = loc.renderer.decode
    for k, call in enumerate(loc.calls):
        role = loc.next_roles[k] if k < len(loc.next_roles) else END
        try:
            boundary = profile.boundary(role)
        except TemplateError:
            continue  # the template cannot append this role; the template view reports what differs
        close = () if boundary.close_omitted and _single_call(loc, messages, k) else boundary.close_ids
        stop = call.output_ids[-1] if call.output_ids else None
        end = call.output_end
        if stop is not None and not end_has_close and close[:1] == (stop,):
            detail = f"the engine stopped on {decode([stop])!r}, which also opens the next message: kept once"
            out.append(_finding(loc, Cause.AMBIGUOUS_STOP_KEPT, allowed, k, Span(end - 1, end), detail))
            continue
        if stop is not None and (stop in close[:1] or (not close and stop in closes)):
            continue
        if stop is not None and stop in turn_ends:
            where = f"before a {role} message" if role != END else "at the end"
            written = decode(close) if close else "no close"
            detail = (
                f"the turn ended on {decode([stop])!r}, one of the template's turn ends; it writes {written!r} "
                f"{where}: the sampled one is kept as the close"
            )
            out.append(_finding(loc, Cause.CLOSE_VARIANT, allowed, k, Span(end - 1, end), detail))
            continue
        if stop is not None and stop in aliases:
            detail = f"stopped on {decode([stop])!r}, a stop id the template never renders; kept as sampled"
            out.append(_finding(loc, Cause.EOS_ALIAS, allowed, k, Span(end - 1, end), detail))
        if not close:
            continue
        inserted = tuple(stream[end : end + len(close)]) == close
        cut = end + len(close) > len(stream) and tuple(stream[end:]) == close[: len(stream) - end]
        if not inserted and role != END and not cut:  # a close the response length cut off is not missing
            detail = f"the turn ended without the template's close {decode(close)!r}, and none was inserted"
            out.append(_finding(loc, Cause.CLOSE_MISSING, allowed, k, Span(end, end), detail))
        elif inserted:
            if call.finish_reason == "length":
                why = "the length limit"
            else:
                why = repr(decode([stop])) if stop is not None else "an empty output"
            detail = f"the turn ended on {why}; the template's close {decode(close)!r} was inserted (mask 0)"
            out.append(_finding(loc, Cause.SYNTHETIC_CLOSE, allowed, k, Span(end, end + len(close)), detail))
    return out


def _single_call(loc: Locator, messages: Sequence[Mapping[str, Any]], turn: int) -> bool:
    """Whether turn ``turn``'s message holds one tool call: the template that omits its close after a single call
    (``Boundary.close_omitted``) writes none there, and verl_ext inserts none."""
    at = loc.assistant_indices[turn] if turn < len(loc.assistant_indices) else -1
    if not 0 <= at < len(messages):
        return False
    calls = messages[at].get("tool_calls")
    return isinstance(calls, Sequence) and len(calls) == 1


def _finding(
    loc: Locator, cause: Cause, allowed: Callable[[Cause], bool], turn: int, span: Span, detail: str
) -> Finding:
    return loc.finding(cause, allowed(cause), span, Span(0, 0), (), detail, turn=turn, region="boundary")
