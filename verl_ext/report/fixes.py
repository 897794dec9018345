"""What to do about each thing the check reports: one line per cause, engine-view failure kind and run-wide problem.

To extend: add a line to ``CAUSE_FIXES`` (a new ``Cause``) or ``ENGINE_FIXES`` (a new ``FailureKind``); the report
links every finding to its line. A cause or kind missing here still gets ``GENERIC_FIX``, never an empty cell.
"""

from __future__ import annotations

NOTHING = "Nothing to do: "
SWITCH = "Switch the loop to verl_ext (actor_rollout_ref.rollout.agent.default_agent_loop=verl_ext_tool_agent)"

CAUSE_FIXES: dict[str, str] = {
    "bpe_remerge": NOTHING + "the stream keeps the ids the model sampled; re-encoding the text would change them.",
    "tool_call_reserialized": NOTHING + "the tool-call JSON is trained as sampled; the template only re-serializes it.",
    "malformed_tool_call": NOTHING + "a tool call the parser could not read is trained as sampled; the loop answered "
    "it with an error (counted in tito/tool/malformed).",
    "reasoning_stripped": NOTHING + "the thinking is trained as sampled; the template drops it from later prompts.",
    "reasoning_inserted": NOTHING + "the template renders a thinking block the model never sampled; it is not trained.",
    "eos_alias": NOTHING + "the turn stopped on an alias of end-of-text, kept as sampled; its close is added, mask 0.",
    "synthetic_close": NOTHING + "the template's close was inserted with mask 0, so it is never trained.",
    "special_token_escaped": NOTHING + "special-token text in tool/user content stays text, as the engine saw it.",
    "ambiguous_stop_kept": NOTHING + "a stop that also opens the next message is kept once.",
    "close_variant": NOTHING + "the turn ended on another of the template's turn ends, kept as its close.",
    "tool_result_labelled": NOTHING + "each tool result is labelled with its own call's name, as the engine saw it.",
    "context_moved": NOTHING + "the template moves a block (tool list, system text); the stream keeps it in place.",
    "prefill_dropped": NOTHING + "the pre-fill (an empty think block) is kept as the engine saw it.",
    "content_whitespace": NOTHING + "the content is trained as sampled; the template strips or adds whitespace.",
    "reasoning_reformatted": NOTHING + "the thinking is trained as sampled; the template re-writes its tags or parts.",
    "sampled_text_kept": NOTHING + "the turn is trained as sampled; the template writes the same message its own way.",
    "template_refused": "The template cannot render these messages (e.g. two tool calls in one turn): set "
    "actor_rollout_ref.rollout.multi_turn.max_parallel_calls=1; the engine view still proves the tokens.",
    "boundary_missing": SWITCH + ": the stock loop drops text the template renders after a turn's close (Qwen's \\n).",
    "close_missing": SWITCH + " and list the engine's extra stops (e.g. </tool_call>) in verl_ext.extra_stop_tokens: "
    "a turn that stops on one then gets the template's close (`verl-ext check-template DIR --stop TOKEN` shows it).",
    "ambiguous_stop_duplicated": SWITCH + ": it keeps a stop that also opens the next message once, not twice.",
    "special_token_injected": SWITCH + " with verl_ext.escape_special_tokens=true (default): tool text then stays "
    "text instead of becoming a fake turn boundary.",
    "message_differs": "The loop's assistant message does not hold what the engine sampled (e.g. a tool call run "
    "with other arguments): build each message from the sampled ids with the tool parser, as verl_ext_tool_agent "
    "does (actor_rollout_ref.rollout.agent.default_agent_loop=verl_ext_tool_agent).",
    "stop_text_in_message": SWITCH + ": the stock hermes parser decodes the stop token into the assistant message.",
    "unknown": "Open the rollout below and compare stream and template; `verl-ext replay FILE --tokenizer DIR` "
    "replays every record, numbered by line, and names where it differs from what was trained. Report it with the "
    "record if the template view is wrong.",
}

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
}

TRUNCATION_FIX = (
    "Raise the response budget (actor_rollout_ref.rollout.response_length and data.max_response_length) or cap the "
    "turns (actor_rollout_ref.rollout.multi_turn.max_assistant_turns): cut tokens are sampled but never trained."
)
SKIPPED_FIX = (
    "Raise verl_ext.check.template_view_budget_s (or null for no limit), or lower verl_ext.check.template_view_rate."
)
GENERIC_FIX = "No fix is recorded for this yet: open the rollout below and read the finding's detail."


def cause_fix(cause: str) -> str:
    """The one-line fix for a finding's cause (a generic one for a cause this version does not know)."""
    return CAUSE_FIXES.get(cause, GENERIC_FIX)


def engine_fix(kind: str) -> str:
    """The one-line fix for an engine-view failure kind (a generic one for a kind this version does not know)."""
    return ENGINE_FIXES.get(kind, GENERIC_FIX)
