"""Every chat template in tests/fixtures (the shipped tokenizers' own, the Qwen3-family extras, and the
template-only files over a shipped tokenizer given their markers) through the probe, fuzzed trajectories
(invariants, engine view, zero injected control tokens) and canonical parity where the template is append-stable."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rollouts import Turn, run
from template_fixtures import SHIPPED, TOOLS, markers, template_renderer
from template_fixtures import TEMPLATE_CASES as CASES

from verl_ext.check import Cause, ConsistencyChecker
from verl_ext.core.errors import TemplateError
from verl_ext.core.invariants import check_invariants
from verl_ext.core.probe import probe_template
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.replay import ReplayRecord, replay
from verl_ext.core.template_profile import END, TemplateProfile, Verdict
from verl_ext.core.trajectory import TokenKind


def tool_call(n: int, name: str = "calculator") -> dict[str, Any]:
    return {"id": f"call{n:05d}", "type": "function", "function": {"name": name, "arguments": {"x": str(n)}}}


def tool_result(n: int, content: str, name: str = "calculator") -> dict[str, Any]:
    return {"role": "tool", "content": content, "tool_call_id": f"call{n:05d}", "name": name}


@pytest.fixture(scope="session")
def case_renderer(
    renderer_for: Callable[[str], ChatRenderer], load_tokenizer: Callable[[str], Any]
) -> Callable[[str], ChatRenderer]:
    cache: dict[str, ChatRenderer] = {}

    def get(case: str) -> ChatRenderer:
        if case not in cache:
            if case in SHIPPED:
                cache[case] = renderer_for(case)
            elif case.startswith("qwen3/"):
                folder = Path(load_tokenizer("qwen3").name_or_path) / "extra_templates"
                cache[case] = renderer_for("qwen3").with_chat_template((folder / f"{case[6:]}.jinja").read_text())
            else:
                cache[case] = template_renderer(case[len("templates/") :])
        return cache[case]

    return get


# Each case's verdict, pinned: a template that turns unsupported (or ok) is a change to see, never a skip that passes.
VERDICTS: dict[str, Verdict] = {
    **{case: Verdict.REPAIRABLE for case in CASES},
    "templates/google-gemma-2-2b-it": Verdict.UNSUPPORTED,  # here without Gemma's plain whitespace tokens
    "templates/microsoft-Phi-3.5-mini-instruct": Verdict.UNSUPPORTED,
    "templates/phi-4_ollama-gguf": Verdict.UNSUPPORTED,
}


def appendable(profile: TemplateProfile) -> list[str]:
    return [b.next_role for b in profile.boundaries if b.next_role != END]


@pytest.mark.parametrize("case", CASES)
def test_probe_derives_a_consistent_profile(case_renderer, case):
    r = case_renderer(case)
    p = probe_template(r)
    assert p.verdict is VERDICTS[case], (case, p.verdict, [r.text for r in p.reasons])
    assert (p.verdict is Verdict.OK) == (not any(reason.severity.value != "note" for reason in p.reasons))
    for b in p.boundaries:
        assert set(b.close_ids) <= r.control_ids, (b.next_role, r.decode(b.close_ids))
        if b.next_role != END:  # at the end, the trailer is all the template writes after the close (Phi: eos)
            assert not set(b.trailer_ids) & r.control_ids and not r.decode(b.trailer_ids).strip()
    for role, why in p.unsupported_roles.items():
        assert why, role  # every unsupported role says why
    assert p.close_id_set <= p.turn_end_id_set and not p.alias_id_set & p.turn_end_id_set


# -- fuzzed rollouts ----------------------------------------------------------------------------------------------
def hostile_texts(r: ChatRenderer) -> list[str]:
    """Text pieces for untrusted content: the template's own markers and control strings among plain text."""
    control = sorted(
        {r.decode([i]) for i in r.control_ids} & set(markers(r.chat_template or ""))
        | set(markers(r.chat_template or ""))
    )[:12]
    return ["a", " b", "\n", "{}", "é中", *control]


@st.composite
def scripts(draw, r: ChatRenderer, roles: list[str]):
    """Turns of random sampled ids (text and control ids), each followed by a random supported append."""
    vocab = len(r.tokenizer)
    control = sorted(r.control_ids)[:40]
    token = st.one_of(st.integers(0, vocab - 1), st.sampled_from(control)) if control else st.integers(0, vocab - 1)
    text = st.lists(st.sampled_from(hostile_texts(r)), min_size=1, max_size=6).map("".join)
    n = draw(st.integers(1, 3)) if roles else 1  # without an appendable role a rollout is one turn
    turns = []
    for k in range(n):
        ids = draw(st.lists(token, max_size=10))
        finish = draw(st.sampled_from(["stop", "length"]))
        role = draw(st.sampled_from(roles)) if roles and k < n - 1 else None
        turns.append((ids, finish, role, draw(text)))
    return draw(text), turns


def build(r: ChatRenderer, first: str, turns: list, sanitize: Callable[[str], str]):
    """Drive a rollout; an append the template refuses ends the rollout there (a refusal is a clear error)."""
    script = []
    for ids, finish, role, text in turns:
        content = sanitize(text)
        if role == "tool":
            message = {"role": "assistant", "content": "", "tool_calls": [tool_call(1)]}
            follow = [tool_result(1, content)]
        elif role is not None:
            message, follow = {"role": "assistant", "content": "ok"}, [{"role": role, "content": content}]
        else:
            message, follow = {"role": "assistant", "content": "ok"}, []
        script.append(Turn(ids, message, follow, finish))
    while True:
        try:
            return run(r, script, prompt=[{"role": "user", "content": sanitize(first)}], tools=TOOLS)
        except TemplateError:
            if len(script) == 1 or not script[-2].followup:
                raise
            script = [*script[:-2], Turn(script[-2].output_ids, script[-2].message, (), script[-2].finish)]


@pytest.mark.parametrize("case", CASES)
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_fuzzed_rollouts_keep_invariants_engine_view_and_inject_nothing(case_renderer, case, data):
    r = case_renderer(case)
    p = probe_template(r)
    if END in p.unsupported_roles:
        pytest.skip(f"the engine's output cannot be placed: {p.unsupported_roles[END]}")
    first, turns = data.draw(scripts(r, appendable(p)))
    try:
        ro = build(r, first, turns, sanitize=str)
    except TemplateError as exc:
        pytest.skip(f"the template refuses the first prompt: {exc}")
    t = ro.trajectory
    report = check_invariants(t)
    assert report.ok, report.failures
    result = ConsistencyChecker(r, p).check(ro.calls, ro.sample(), ro.messages, TOOLS, template_view=True)
    assert result.engine_ok, result.engine_failures
    assert Cause.SPECIAL_TOKEN_INJECTED not in result.cause_counts()

    # Zero injected control tokens: the same rollout with every control string taken out of the untrusted
    # texts has exactly as many control tokens outside the sampled ones.
    strings = sorted({r.decode([i]) for i in r.control_ids}, key=len, reverse=True)

    def benign(text: str) -> str:
        for s in strings:
            text = text.replace(s, "x")
        return text

    twin = build(r, first, turns, sanitize=benign).trajectory

    def context_controls(tr) -> int:
        return sum(
            i in r.control_ids for i, k in zip(tr.input_ids, tr.kinds, strict=True) if k is not TokenKind.SAMPLED
        )

    if len(twin.turns) == len(t.turns):
        assert context_controls(t) == context_controls(twin)


# -- canonical parity -----------------------------------------------------------------------------------------------
# Templates where an append a rollout may make is a known gap (checked to still be one, so it stays visible). None:
# Seed-OSS's user append (its text turn with empty content has no close) works since the delta's synthetic assistant
# turn carries text, as a real turn does; test_seed_oss_appends_a_user_message_after_a_text_turn keeps it so.
KNOWN_GAPS: set[tuple[str, str]] = set()


def test_seed_oss_appends_a_user_message_after_a_text_turn(case_renderer):
    """Seed-OSS writes an assistant turn whose content is empty without its <seed:eos>: the delta for an appended
    user message must still hold that message (it used to be refused as dropped text)."""
    r = case_renderer("templates/ByteDance-Seed-OSS")
    p = probe_template(r)
    assert p.boundary("user").prefix_preserving
    chat = conversations(p)["user"]
    t = replay(r, ReplayRecord.from_json({"messages": chat, "tools": TOOLS}))
    assert t.input_ids + list(p.boundary(END).trailer_ids) == r.encode(r.render_text(chat, TOOLS))
    assert "How are you?" in r.decode(t.input_ids[t.turns[0].sampled_end : t.turns[1].prompt_length])


def conversations(p: TemplateProfile) -> dict[str, list[dict[str, Any]]]:
    out = {}
    if "tool" in appendable(p):
        out["tool"] = [
            {"role": "user", "content": "What is 1+1?"},
            {"role": "assistant", "content": "", "reasoning_content": "Use the tool.", "tool_calls": [tool_call(1)]},
            tool_result(1, "2"),
            {"role": "assistant", "content": "It is 2."},
        ]
    if "user" in appendable(p):
        out["user"] = [
            {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "How are you?"},
            {"role": "assistant", "content": "Fine."},
        ]
    return out


@pytest.mark.parametrize("case", CASES)
def test_canonical_rollouts_match_the_template_where_it_is_append_stable(case_renderer, case):
    r = case_renderer(case)
    p = probe_template(r)
    if END in p.unsupported_roles:
        pytest.skip(f"the engine's output cannot be placed: {p.unsupported_roles[END]}")
    checked = 0
    for role, chat in conversations(p).items():
        if (case, role) in KNOWN_GAPS:
            continue
        try:
            t = replay(r, ReplayRecord.from_json({"messages": chat, "tools": TOOLS}))
        except TemplateError as exc:
            assert "canonical output is undefined" in str(exc), exc  # the only refusal a replay may give
            continue
        stable = p.boundary(role).prefix_preserving and p.boundary(END).prefix_preserving
        expected = r.encode(r.render_text(p.tool_call_shape.conform(chat), TOOLS))  # the convention it renders
        if stable:
            assert t.input_ids + list(p.boundary(END).trailer_ids) == expected, r.decode(t.input_ids)
        calls = _calls(t)
        result = ConsistencyChecker(r, p).check(calls, _sample(t), t.messages, TOOLS, template_view=True)
        assert result.engine_ok, result.engine_failures
        assert not [f for f in result.defects], [(f.cause.value, f.detail) for f in result.defects]
        checked += 1
    if not checked:
        pytest.skip("the template appends neither a tool nor a user message")


def _calls(t):
    from verl_ext.check.inputs import EngineCall

    out = []
    for turn in t.turns:
        prompt = t.input_ids[: turn.prompt_length]
        ids = t.input_ids[turn.sampled_start : turn.sampled_end]
        out.append(EngineCall.of(prompt, ids, t.logprobs[turn.sampled_start : turn.sampled_end], "stop"))
    return out


def _sample(t):
    from verl_ext.check.inputs import trainer_sample_from_trajectory

    return trainer_sample_from_trajectory(t)


@pytest.mark.parametrize("case", CASES)
def test_every_stop_id_gets_a_named_cause(case_renderer, case):
    """A turn may end on any stop id the profile knows (closes, eos, generation_config, end-of-text names): the
    check names what that does, never `unknown`, and finds no defect."""
    from verl_ext.core.replay import canonical_output

    r = case_renderer(case)
    p = probe_template(r)
    if END in p.unsupported_roles or "user" not in appendable(p) or (case, "user") in KNOWN_GAPS:
        pytest.skip("the template cannot place the output or append a user message")
    chat = [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "How are you?"},
        {"role": "assistant", "content": "Fine."},
    ]
    try:
        first, last = canonical_output(r, chat, 1), canonical_output(r, chat, 3)
    except TemplateError as exc:
        pytest.skip(str(exc))
    body = first[:-1] if first and first[-1] in p.turn_end_id_set else first
    for stop in p.stop_ids:
        ro = run(r, [Turn([*body, stop.id], chat[1], [chat[2]]), Turn(last, chat[3])], prompt=chat[:1], tools=None)
        result = ConsistencyChecker(r, p).check(ro.calls, ro.sample(), ro.messages, template_view=True)
        assert result.engine_ok and check_invariants(ro.trajectory).ok
        assert not result.defects, (stop.text, [(f.cause.value, f.detail) for f in result.defects])
