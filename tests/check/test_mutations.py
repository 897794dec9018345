"""The check is not blind: real defects injected into otherwise clean rollouts are each reported, in the right turn.

On every shipped template (and Qwen3 with thinking off), a clean rollout is built by the token core from what a
model trained on the template samples (``loop_rollouts.canonical_message_text``: the template's own text for each
assistant message, then the close it writes before the next message): a tool call, its result, an answer, a user
message (after a system message, or with the tool result or the user message as a list of text parts, in the
variants), and an answer. The final messages are those the template rendered the sampled text from, so the
template view runs on every template (verl's parsers do not read every template's own call text). It is first
checked clean. A mutation then changes what a faulty loop would change (the stream and so every engine
prompt after the change, or the final messages, or the trainer's copy) and the check must report a defect or an
engine-view failure in the turn the mutation touched. A mutation that cannot apply to a template is skipped with
the template's own reason (a template that writes no trailer after a close has no repair to drop; one that cannot
append a system message has none to inject into), each reason checked against the template's profile. The
property test beside this file (arbitrary engine output, zero defects) is the other half: a check that reported
everything would pass this file and fail that one.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest
from loop_rollouts import canonical_message_text
from rollouts import TOOLS, Pieces, Turn, call, naive, pieces_by_kind, run, tool_result

from verl_ext.check import ConsistencyChecker
from verl_ext.check.findings import CheckResult
from verl_ext.check.inputs import EngineCall, TrainerSample
from verl_ext.core.call_reader import learn_call_reader
from verl_ext.core.errors import TemplateError
from verl_ext.core.probe import probe_template
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.template_profile import TemplateProfile
from verl_ext.demo.run import shipped_tokenizers

# Every shipped tokenizer with its template's arguments.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3": ("qwen3", {}),
    "qwen3 enable_thinking=False": ("qwen3", {"enable_thinking": False}),
    "qwen2.5": ("qwen2.5", {}),
    "gpt-oss": ("gpt-oss", {}),
    "mistral-7b-v0.3": ("mistral-7b-v0.3", {}),
}
# Contents distinct enough to be found in the decoded stream: where a faulty loop puts special-token text.
RESULT, SYSTEM, USER = "RESULT 3", "Answer in one word.", "Thanks. And 2+2?"
CALL_TURN, TEXT_TURN = 0, 1  # the engine call after which the tool result, and the user message, are appended
TOOL_AT, USER_AT = 2, 4  # their places in the final messages (after the prompt's one user message)


@dataclass
class Clean:
    """A clean rollout as pieces of the stream by kind (prompt, sampled, repair, context) and its final messages."""

    r: ChatRenderer
    profile: TemplateProfile
    pieces: Pieces
    messages: list[dict[str, Any]]

    engine: Pieces | None = None  # what the engine returned, where a mutation changes the trainer's stream only

    def copy(self) -> Clean:
        return Clean(self.r, self.profile, copy.deepcopy(self.pieces), copy.deepcopy(self.messages))

    def check(self) -> CheckResult:
        calls, sample = naive(self.r, self.pieces)
        if self.engine is not None:
            calls = naive(self.r, self.engine)[0]
        return ConsistencyChecker(self.r, self.profile).check(calls, sample, self.messages, TOOLS, template_view=True)

    def nth(self, kind: str, n: int = 0) -> int:
        """The index of the ``n``-th piece of ``kind``."""
        return [k for k, (name, _) in enumerate(self.pieces) if name == kind][n]


# How tokenizers are loaded: the test session's shared loader (``load_tokenizer`` in conftest, set below), else
# transformers' (the bench imports this module without pytest).
LOADER: dict[str, Callable[[str], Any]] = {}


@pytest.fixture(autouse=True, scope="module")
def _session_tokenizers(load_tokenizer: Callable[[str], Any]) -> None:
    LOADER["load"] = load_tokenizer


@cache
def renderer(case: str) -> tuple[ChatRenderer, TemplateProfile]:
    from transformers import AutoTokenizer

    family, kwargs = CASES[case]
    load = LOADER.get("load") or (lambda name: AutoTokenizer.from_pretrained(str(shipped_tokenizers()[name])))
    r = ChatRenderer(load(family), template_kwargs=kwargs)
    return r, probe_template(r)


def unsupported(case: str, variant: str) -> str:
    """Why the template cannot build ``variant`` (empty where it can): its profile's own reason."""
    _, profile = renderer(case)
    return profile.unsupported_roles.get("system", "") if variant == "system" else ""


@cache
def _clean(case: str, variant: str) -> Clean | str:
    """``variant``: "plain"; "system" (a system message before the user message); "list tool", "list user" (that
    message's content as a list of text parts); "two calls" (the first turn calls twice); "malformed call" (the first
    turn samples a call verl's hermes parser cannot read before the one it reads: hermes templates only). A text: why
    it cannot be built (the token core refuses it: the template does not render such a message after a turn; or the
    template writes no such turn)."""
    r, profile = renderer(case)

    def parts(text: str, role: str) -> Any:
        return [{"type": "text", "text": text}] if variant == f"list {role}" else text

    def sampled(message: dict[str, Any], followup: list[dict[str, Any]]) -> Turn:
        """What a model trained on the template samples for ``message`` (the template's own text, and its close
        before the first message of ``followup``), then ``followup``."""
        text = canonical_message_text(r, profile, message)
        assert text, f"{case}: the template renders no text for {message}"
        close = profile.boundary(followup[0]["role"] if followup else "end").close_ids[0]
        return Turn([*r.encode(text), close], message, followup)

    calling = {"role": "assistant", "content": "", "tool_calls": [call("1+2")]}
    answer = {"role": "assistant", "content": "The answer is 3."}
    then = [*([{"role": "system", "content": SYSTEM}] if variant == "system" else [])]
    then.append({"role": "user", "content": parts(USER, "user")})
    result = {**tool_result(), "content": parts(RESULT, "tool")}
    results = [result]
    if variant == "two calls":
        calling["tool_calls"] = [call("1+2"), call("2*5", 2)]
        results = [result, tool_result("10", 2)]
        if not canonical_message_text(r, profile, calling):
            return "the template renders no text for two tool calls in one message"
        if not learn_call_reader(r, profile).reader.form.several:
            # GPT-OSS renders a message's first call only (harmony: one call per message, the turn stops at <|call|>):
            # such a turn samples one call, so a message of two is not a rollout the loop builds (its second call is
            # never rendered, so a change to it changes no render: nothing to catch in the template view)
            alone = {**calling, "tool_calls": calling["tool_calls"][:1]}
            assert canonical_message_text(r, profile, calling) == canonical_message_text(r, profile, alone)
            return "the template renders one tool call per message (the reader derived from it reads one per turn)"
    first = sampled(calling, results)
    if variant == "malformed call":
        # a call the parser cannot read ("parameters"), then the call it read: the message holds the one it read
        text = canonical_message_text(r, profile, calling)
        if "<tool_call>" not in text:
            return "the template does not write hermes calls: verl's hermes parser does not read its turns"
        first = Turn([*r.encode(MALFORMED + "\n"), *first.output_ids], calling, results)
    try:
        t = run(r, [first, sampled(answer, then), sampled(answer, [])]).trajectory
    except TemplateError as exc:
        if variant == "plain":
            raise
        return str(exc)
    pieces = pieces_by_kind(t)
    return Clean(r, profile, pieces, [dict(m) for m in t.messages])


def clean(case: str, variant: str = "plain") -> Clean:
    """A fresh copy of the clean rollout (built once per case and variant)."""
    if why := unsupported(case, variant):
        pytest.skip(f"{case}: {why}")
    built = _clean(case, variant)
    if isinstance(built, str):
        pytest.skip(f"{case}: the loop refuses this rollout: {built}")
    return built.copy()


def special_text(c: Clean) -> str:
    """A turn end of the template's as text: what a faulty loop turns into a real special token."""
    return c.r.decode([c.profile.boundary("user").close_ids[0]])


def inject_special(c: Clean, after_turn: int, at: int, content: str) -> None:
    """Special-token text in message ``at``'s content (appended after engine call ``after_turn``), and the context
    after that call re-encoded from its text with the special-token text made a real token (as a loop that encodes
    rendered text does)."""
    fake = content + special_text(c)
    message = c.messages[at]
    message["content"] = [{"type": "text", "text": fake}] if isinstance(message["content"], list) else fake
    k = c.nth("context", after_turn)
    text = c.r.decode(c.pieces[k][1])
    assert text.count(content) == 1, (content, text)
    c.pieces[k] = ("context", c.r.encode(text.replace(content, fake)))


def drop_repair(c: Clean) -> None:
    if not any(kind == "repair" for kind, _ in c.pieces):
        trailers = {b.next_role: b.trailer_ids for b in c.profile.boundaries if b.trailer_ids}
        assert not trailers, f"the template writes trailers {trailers} but the loop repaired none"
        pytest.skip("the template writes nothing after a turn's close: no boundary repair to drop")
    del c.pieces[c.nth("repair")]


def double_close(c: Clean) -> None:
    k = c.nth("sampled", CALL_TURN)
    c.pieces.insert(k + 1, ("repair", [c.pieces[k][1][-1]]))  # the sampled close, inserted once more


def arguments_differ(c: Clean) -> None:
    (function,) = [tc["function"] for tc in c.messages[1]["tool_calls"]]
    other = {"expression": "1+1"}
    function["arguments"] = json.dumps(other) if isinstance(function["arguments"], str) else other


def duplicate_context(c: Clean) -> None:
    k = c.nth("context", CALL_TURN)
    c.pieces.insert(k, ("context", list(c.pieces[k][1])))


def context_missing_from_stream(c: Clean) -> None:
    c.messages.insert(TOOL_AT + 1, copy.deepcopy(c.messages[TOOL_AT]))  # a tool result the stream never had


def context_missing_from_messages(c: Clean) -> None:
    del c.messages[USER_AT]  # the stream holds a user message the loop's messages lost


def context_from_decoded_text(c: Clean) -> None:
    k = c.nth("context", CALL_TURN)
    c.pieces[k] = ("context", c.r.encode(" " + c.r.decode(c.pieces[k][1])))  # re-encoded from text: another split


def special_in_tool(c: Clean) -> None:
    inject_special(c, CALL_TURN, TOOL_AT, RESULT)


def special_in_user(c: Clean) -> None:
    inject_special(c, TEXT_TURN, USER_AT if c.messages[USER_AT]["role"] == "user" else USER_AT + 1, USER)


def special_in_system(c: Clean) -> None:
    assert c.messages[USER_AT]["role"] == "system", c.messages
    inject_special(c, TEXT_TURN, USER_AT, SYSTEM)


MALFORMED = '<tool_call>\n{"name": "calculator", "parameters": {"expression": "1+2"}}\n</tool_call>'


def drop_call(c: Clean) -> None:
    del c.messages[1]["tool_calls"][1]  # the loop lost a call the model made (its result is still there)


def swap_calls(c: Clean) -> None:
    calls = c.messages[1]["tool_calls"]
    calls[0]["function"], calls[1]["function"] = calls[1]["function"], calls[0]["function"]


def second_arguments_differ(c: Clean) -> None:
    function = c.messages[1]["tool_calls"][1]["function"]
    other = {"expression": "2*6"}
    function["arguments"] = json.dumps(other) if isinstance(function["arguments"], str) else other


def malformed_text_removed(c: Clean) -> None:
    c.engine = copy.deepcopy(c.pieces)
    k = c.nth("sampled", CALL_TURN)
    drop = len(c.r.encode(MALFORMED + "\n"))
    c.pieces[k] = ("sampled", c.pieces[k][1][drop:])  # the stream lacks the malformed call the engine sampled


@dataclass(frozen=True)
class Mutation:
    mutate: Callable[[Clean], None]
    turn: int  # the engine call the defect belongs to
    variant: str = "plain"


MUTATIONS: dict[str, Mutation] = {
    "dropped boundary repair": Mutation(drop_repair, CALL_TURN),
    "doubled close": Mutation(double_close, CALL_TURN),
    "tool call arguments differ from what was sampled": Mutation(arguments_differ, CALL_TURN),
    "a tool call dropped from the message": Mutation(drop_call, CALL_TURN, "two calls"),
    "two tool calls swapped in the message": Mutation(swap_calls, CALL_TURN, "two calls"),
    "the second tool call's argument changed": Mutation(second_arguments_differ, CALL_TURN, "two calls"),
    "a malformed call's text removed from the stream": Mutation(malformed_text_removed, CALL_TURN, "malformed call"),
    "context message duplicated in the stream": Mutation(duplicate_context, CALL_TURN),
    "context message missing from the stream": Mutation(context_missing_from_stream, CALL_TURN),
    "context message missing from the messages": Mutation(context_missing_from_messages, TEXT_TURN),
    "context delta rendered from decoded text": Mutation(context_from_decoded_text, CALL_TURN),
    "special token created in a tool message": Mutation(special_in_tool, CALL_TURN),
    "special token created in a user message": Mutation(special_in_user, TEXT_TURN),
    "special token created in a system message": Mutation(special_in_system, TEXT_TURN, "system"),
    "special token created in list-shaped tool content": Mutation(special_in_tool, CALL_TURN, "list tool"),
    "special token created in list-shaped user content": Mutation(special_in_user, TEXT_TURN, "list user"),
}


def mutated(case: str, name: str) -> CheckResult:
    """The check's result on the case's clean rollout with the named mutation (``pytest.skip`` where it cannot
    apply)."""
    m = MUTATIONS[name]
    c = clean(case, m.variant)
    m.mutate(c)
    return c.check()


def reported_in_turn(result: CheckResult, turn: int) -> bool:
    return bool(result.engine_failures) or any(f.turn == turn for f in result.findings if not f.allowed)


@pytest.mark.parametrize("variant", ["plain", "system", "list tool", "list user", "two calls", "malformed call"])
@pytest.mark.parametrize("case", list(CASES))
def test_the_clean_rollout_is_clean(case, variant):
    result = clean(case, variant).check()
    assert result.ok and result.engine_ok, result.summary()


# Misses the check has (each a strict xfail: it fails the suite once the check catches it; docs/check.md, "Not yet
# there"). None now.
KNOWN_MISSES: dict[tuple[str, str], str] = {}


def params() -> list[Any]:
    """(name, case) for every mutation on every case, a known miss marked as a strict xfail."""
    return [
        pytest.param(name, case, marks=pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[case, name]))
        if (case, name) in KNOWN_MISSES
        else pytest.param(name, case)
        for name in MUTATIONS
        for case in CASES
    ]


@pytest.mark.parametrize(("name", "case"), params())
def test_every_injected_defect_is_reported_in_its_turn(case, name):
    result = mutated(case, name)
    defects = [(f.cause.value, f.turn) for f in result.findings if not f.allowed]
    assert reported_in_turn(result, MUTATIONS[name].turn), f"{name}: {defects or result.summary()}"


@pytest.mark.parametrize("case", list(CASES))
def test_a_turn_changed_between_calls_is_a_prefix_failure(case):
    c = clean(case)
    calls, sample = naive(c.r, c.pieces)
    later = calls[1]
    changed = list(later.prompt_ids)
    changed[calls[0].output_start] += 1  # the first turn's tokens changed before the second call
    calls[1] = EngineCall.of(changed, later.output_ids, later.logprobs, later.finish_reason)
    result = ConsistencyChecker(c.r, c.profile).check(calls, sample, c.messages, TOOLS)
    assert "prefix" in {f.kind.value for f in result.engine_failures}, result.summary()


@pytest.mark.parametrize("case", list(CASES))
def test_a_trainer_stream_shifted_by_one_is_an_engine_view_failure(case):
    c = clean(case)
    calls, sample = naive(c.r, c.pieces)
    shifted = TrainerSample.of(
        sample.prompt_ids,
        [*sample.response_ids[1:], sample.response_ids[-1]],
        sample.response_mask,
        sample.response_logprobs,
    )
    result = ConsistencyChecker(c.r, c.profile).check(calls, shifted, c.messages, TOOLS)
    assert result.engine_failures, result.summary()
