"""Messages the loop's final messages lost, read from the engine calls alone (no render).

Each engine call after the first answers what was appended after the call before it: where the stream holds context
between two turns (more than the turn's close and the next generation prompt) and the messages hold the two turns'
assistant messages side by side, a message the engine saw is missing from the messages. Used where the template
view cannot run (a template that refuses the final messages: Mistral v0.3 refuses roles that do not alternate, which
is what losing a user message makes of them), so the loss is still named, in the turn whose context it was.
"""

from __future__ import annotations

from collections.abc import Callable

from verl_ext.check.findings import Cause, Finding, Span
from verl_ext.check.locate import Locator
from verl_ext.core.template_profile import TemplateProfile


def lost_message_findings(loc: Locator, profile: TemplateProfile, allowed: Callable[[Cause], bool]) -> list[Finding]:
    """An ``unknown`` finding per turn whose context the engine saw while the messages hold nothing after it."""
    out: list[Finding] = []
    closes = profile.close_id_set
    gen = tuple(profile.generation_prompt_ids)
    at = loc.assistant_indices
    for k in range(1, min(len(loc.calls), len(at))):
        if at[k] != at[k - 1] + 1:
            continue  # something lies between the two assistant messages
        start, end = loc.calls[k - 1].output_end, loc.calls[k].output_start
        gap = list(loc.stream[start:end])
        while gap and gap[0] in closes:
            gap.pop(0)
        if gen and tuple(gap[len(gap) - len(gen) :]) == gen:
            gap = gap[: len(gap) - len(gen)]
        if not gap:
            continue
        text = loc.renderer.decode(gap)
        detail = (
            f"the engine saw {text[:80]!r} after turn {k - 1}, but the messages hold turn {k}'s assistant message "
            f"right after turn {k - 1}'s: the loop's messages lost what was appended there (the template refuses "
            "the messages as they are, so no re-render can show it)"
        )
        span = Span(start, end)
        out.append(
            loc.finding(
                Cause.UNKNOWN, allowed(Cause.UNKNOWN), span, Span(0, 0), (), detail, turn=k - 1, region="context"
            )
        )
    return out
