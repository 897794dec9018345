"""The report's first line: one verdict over everything the check saw, and the list of what to do, worst first.

Red when any rollout would train on tokens that are not the engine's or that differ from the template by a defect;
amber when the tokens are right but something was lost (sampled tokens cut by truncation, template views skipped);
green only when nothing of that happened.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from verl_ext.report.fixes import NUMERICS_FIX, SKIPPED_FIX, TRUNCATION_FIX, cause_fix, engine_fix
from verl_ext.report.summary import Summary

if TYPE_CHECKING:
    from verl_ext.report.numerics import NumericsSection


@dataclass(frozen=True)
class Action:
    """One line of the page's verdict: what happened, its fix and where the fix is explained."""

    level: str  # "bad" | "warn" | "info"
    text: str  # what happened, with counts
    fix: str  # the one-line fix
    link: str  # anchor of its row in the fixes table


@dataclass(frozen=True)
class Verdict:
    """The page's verdict: its level, headline and actions."""

    level: str  # "bad" | "warn" | "good"
    headline: str
    actions: tuple[Action, ...]


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def verdict(
    s: Summary, cause_fixes: Mapping[str, str] | None = None, engine_fixes: Mapping[str, str] | None = None
) -> Verdict:
    """The verdict the summary adds up to: engine failures first, then defects, lost tokens and skipped checks.
    ``cause_fixes`` / ``engine_fixes``: the fix of each cause and kind as chosen for the loops that wrote the records
    (``report.build.chosen_fixes``); a name they lack gets the stock loop's."""
    causes, kinds = cause_fixes or {}, engine_fixes or {}
    actions: list[Action] = []
    for kind, n in s.engine_failure_kinds.items():
        fix = kinds.get(kind) or engine_fix(kind)
        actions.append(Action("bad", f"engine view: {_n(n, 'failure')} of kind {kind}", fix, f"fix-engine-{kind}"))
    for row in sorted((r for r in s.causes if r.defects), key=lambda r: -r.defects):
        text = f"{row.cause}: {_n(row.defects, 'defect')} in {_n(row.rollouts, 'rollout')}"
        actions.append(Action("bad", text, causes.get(row.cause) or cause_fix(row.cause), f"fix-{row.cause}"))
    if s.lost_sampled_tokens:
        text = (
            f"{100 * s.lost_share:.1f}% of sampled tokens lost to truncation ({s.lost_sampled_tokens} of "
            f"{s.sampled_tokens}, in {_n(s.truncated_rollouts_lost, 'rollout')}): sampled, never trained"
        )
        actions.append(Action("warn", text, TRUNCATION_FIX, "fix-truncation"))
    if s.template_view_skipped:
        text = f"template view skipped on {_n(s.template_view_skipped, 'rollout')}: it ran out of its time budget"
        actions.append(Action("warn", text, SKIPPED_FIX, "fix-skipped"))
    allowed = [r for r in s.causes if r.allowed]
    if allowed:
        counts = ", ".join(f"{r.cause}×{r.allowed}" for r in allowed)
        text = f"{_n(sum(r.allowed for r in allowed), 'finding')} allowed ({counts})"
        actions.append(Action("info", text, "Nothing to do: verl_ext keeps the engine's tokens there on purpose.", ""))

    bad = s.defect_rollouts
    if s.engine_failures:
        level = "bad"
        headline = (
            f"Not safe to train: in {_n(s.engine_failed_rollouts, 'rollout')} the trainer's tokens, mask or logprobs "
            f"are not what the engine sampled, and {bad} of {s.rollouts} rollouts ({100 * s.defect_rate:.1f}%) have "
            "an engine failure or a defect"
        )
    elif bad:
        level = "bad"
        headline = (
            f"Fix before training: {bad} of {s.rollouts} rollouts ({100 * s.defect_rate:.1f}%) have a defect: "
            "their training tokens differ from the chat template's in a way verl_ext does not allow"
        )
    elif s.lost_sampled_tokens or s.template_view_skipped:
        level = "warn"
        headline = "Tokens are consistent, but " + (
            f"{100 * s.lost_share:.1f}% of sampled tokens were cut by truncation and never trained"
            if s.lost_sampled_tokens
            else f"the template view was skipped on {_n(s.template_view_skipped, 'rollout')}"
        )
    else:
        level = "good"
        headline = (
            f"All clear: {_n(s.rollouts, 'rollout')} checked; each trains on exactly the tokens the engine sampled, "
            "and every difference from the chat template is allowed by design"
        )
    return Verdict(level, headline, tuple(actions))


def with_numerics(v: Verdict, numerics: NumericsSection) -> Verdict:
    """The page's verdict with the numbers half: rollouts whose numbers drift are an action (warn), and a page whose
    tokens are all clear says the numbers are not."""
    if numerics.absent or not numerics.drift_rollouts:
        return v
    n = numerics.drift_rollouts
    text = (
        f"numbers: {_n(n, 'rollout')} of {numerics.measured} measured drift (the trainer's logprob of a sampled "
        f"token differs from the engine's by a mean |Δ| past {numerics.options.drift_mean_abs_delta:g} in a turn or "
        "depth bucket)"
    )
    actions = (*v.actions, Action("warn", text, NUMERICS_FIX, "numerics"))
    if v.level != "good":
        return Verdict(v.level, v.headline, actions)
    headline = (
        f"Tokens are consistent, but the numbers drift in {_n(n, 'rollout')}: the trainer's logprobs are not the "
        "engine's there (see Numerics)"
    )
    return Verdict("warn", headline, actions)
