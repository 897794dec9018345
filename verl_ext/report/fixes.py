"""What to do about each thing the check reports: one line per cause, engine-view failure kind and run-wide problem.

To extend: a new ``Cause`` carries its own fix (``Cause.fix``, read into ``CAUSE_FIXES``); a new ``FailureKind`` gets a
line in ``ENGINE_FIXES``. The report links every finding to its line. A cause or kind this version does not know (a
newer record) gets ``GENERIC_FIX``, never an empty cell.

Those lines are written for verl's stock loop, the one a user audits before switching: several say "switch the loop
to verl_ext_tool_agent". On a record verl_ext's own loop wrote (``Loop.builds_tokens``) that is no fix: such a line is
replaced by the loop's own (``OWN_LOOP_FIXES``), else by ``own_loop_bug`` (the tokens verl_ext built are wrong: a
verl_ext bug to report with the record). ``fix_for`` chooses.
"""

from __future__ import annotations

from verl_ext.check.findings import SWITCH_LOOP as SWITCH
from verl_ext.check.findings import Cause
from verl_ext.report.loops import Loop

# A cause's fix is written once, on the cause (``Cause.fix``): the report and docs read it from there.
CAUSE_FIXES: dict[str, str] = {c.value: c.fix for c in Cause}

ENGINE_BROKEN = "The engine output is unusable: "

ENGINE_FIXES: dict[str, str] = {
    "length": "The loop hands the trainer ids, mask and logprobs of unequal lengths: a loop bug. " + SWITCH + ".",
    "prefix": "A turn was changed after the engine returned it (re-tokenized or edited). " + SWITCH + ".",
    "stream": "The training stream is not the engine's tokens (re-tokenized, or cut short of the response length). "
    + SWITCH
    + ".",
    "mask": "The loss mask trains tokens the engine did not sample, or skips sampled ones. " + SWITCH + ".",
    "logprob": "The trainer's rollout logprobs are not the engine's: set actor_rollout_ref.rollout.calculate_log_probs"
    "=true and pass the engine's logprobs through unchanged.",
    "record": "The engine's own record is inconsistent (e.g. fewer logprobs than ids): check the engine and its "
    "logprob settings.",
    "negative_id": ENGINE_BROKEN + "a negative token id; check the engine version and its sampling backend.",
    "id_out_of_vocab": ENGINE_BROKEN + "an id outside the tokenizer; give engine and trainer the same tokenizer.",
    "logprob_count": ENGINE_BROKEN + "not one logprob per id; check the engine's logprob settings.",
    "logprob_not_finite": ENGINE_BROKEN + "a NaN or infinite logprob; check the model's numerics (dtype, weights).",
    "logprob_positive": ENGINE_BROKEN + "a logprob above 0; check the engine's logprob settings.",
    "nan_stop": ENGINE_BROKEN + "the engine hit NaN while sampling and substituted a stop; check the model's numerics.",
    "image_dropped": "An image the engine was given is not in the trainer's images or stream: hand verl every image "
    "(first prompt and tool results) in placeholder order (verl_ext_tool_agent does; docs/vl-models.md).",
    "image_order": "The trainer's images are out of placeholder order: keep the order the template renders them in.",
    "image_expansion": "An image's placeholder run is not the length its grid implies: expand placeholders with the "
    "processor the trainer uses, with the same pixel limits.",
    "image_trained": "Image placeholder tokens carry loss mask 1: they are context, never sampled; mask them 0 (and "
    "ban sampling the image pad id).",
    "image_span": "An image's placeholder run is not where the engine's prompt held it: do not re-tokenize or edit "
    "prompts that hold images. " + SWITCH + ".",
    "image_engine_mismatch": "An engine call was given other images than its prompt's placeholder runs hold (another "
    "image, one more or fewer, another order): pass every image of the prompt, in placeholder order, as image_data "
    "with each call (verl_ext_tool_agent does; docs/vl-models.md).",
}

TRUNCATION_FIX = (
    "Raise the response budget (actor_rollout_ref.rollout.response_length and data.max_response_length) or cap the "
    "turns (actor_rollout_ref.rollout.multi_turn.max_assistant_turns): cut tokens are sampled but never trained."
)
SKIPPED_FIX = (
    "Raise verl_ext.check.template_view_budget_s (or null for no limit), or lower verl_ext.check.template_view_rate."
)
GENERIC_FIX = "No fix is recorded for this yet: open the rollout below and read the finding's detail."


# A stock-loop line that sends the user to verl_ext's loop names it: on verl_ext's own records it is replaced.
STOCK_LOOP_MARK = "verl_ext_tool_agent"
_EXTRA_STOPS = (
    "List the engine's extra stops (e.g. </tool_call>) in verl_ext.extra_stop_tokens: a turn that stops on one then "
    "gets the template's close (`verl-ext check-template DIR --stop TOKEN` shows it). If the turn stopped on no "
    "extra stop, "
)
_ESCAPE = (
    "Keep verl_ext.escape_special_tokens=true (the default): tool text then stays text instead of becoming a fake "
    "turn boundary. If it is true, "
)
# Causes and kinds whose own-loop fix is a setting of that loop, not (only) a bug report; keyed by loop.
OWN_LOOP_FIXES: dict[str, dict[Loop, str]] = {
    "close_missing": {Loop.TOOL_AGENT: _EXTRA_STOPS, Loop.GATEWAY_AGENT: _EXTRA_STOPS},
    "special_token_injected": {Loop.TOOL_AGENT: _ESCAPE, Loop.GATEWAY_AGENT: _ESCAPE},
}


def own_loop_bug(loop: Loop) -> str:
    """The fix where verl_ext's own ``loop`` built tokens its check finds wrong: a bug to report, not a setting."""
    return (
        f"verl_ext's own loop ({loop.value}) built these tokens, so this is a verl_ext bug, not your setup: report it "
        "with the record (`verl-ext replay FILE --tokenizer DIR` names where the replayed tokens differ)."
    )


def fix_for(stock_fix: str, name: str, loop: Loop) -> str:
    """``stock_fix`` (the line for cause or kind ``name`` on verl's stock loop) as the fix for a record ``loop``
    wrote: unchanged unless it sends the user to the loop that wrote the record."""
    if not loop.builds_tokens or STOCK_LOOP_MARK not in stock_fix:
        return stock_fix
    own = OWN_LOOP_FIXES.get(name, {}).get(loop)
    bug = own_loop_bug(loop)
    return own + bug[0].lower() + bug[1:] if own else bug


def cause_fix(cause: str, loop: Loop = Loop.UNKNOWN) -> str:
    """The one-line fix for a finding's cause on a record ``loop`` wrote (a generic one for a cause this version
    does not know)."""
    return fix_for(CAUSE_FIXES.get(cause, GENERIC_FIX), cause, loop)


def engine_fix(kind: str, loop: Loop = Loop.UNKNOWN) -> str:
    """The one-line fix for an engine-view failure kind on a record ``loop`` wrote (a generic one for a kind this
    version does not know)."""
    return fix_for(ENGINE_FIXES.get(kind, GENERIC_FIX), kind, loop)


NUMERICS_FIX = (
    "Find where it starts (the Numerics section: depth, turn, step). Drift growing with depth points at long-context "
    "attention or position handling in one of the two (kernels, RoPE scaling); one turn or one step at a weight sync "
    "(the engine serving other weights); a flat offset at precision (bf16 against fp32). Make the two sides agree "
    "before trusting the importance ratio and KL: docs/numerics.md."
)
