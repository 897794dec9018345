"""Every appended message's text reaches the next prompt, or the append is refused: never a silent drop.

A fuzz over append sequences (tool, user and system messages, alone and together, in any order, short texts that
also occur in a template's own markers: "b", "e", "\\n") after an assistant turn, on every template the suite knows:
the shipped tokenizers' own, Qwen3's variants, and every fixture template over its built tokenizer (the template's
markers added as special tokens to a shipped one), the ones that hoist system messages to the top (DeepSeek V3.1,
R1-Distill) included. The oracle does not search for the text: an accepted append whose next prompt stays the same
when one message's text changes dropped that text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from template_fixtures import SHIPPED, TEMPLATE_CASES, TOOLS, template_renderer

from verl_ext.core.errors import TemplateError, TrajectoryError
from verl_ext.core.probe import probe_template
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.template_profile import END, TemplateProfile
from verl_ext.core.trajectory import TokenTrajectory

PROMPT = [{"role": "user", "content": "What is 1+1?"}]
# Short texts: letters and whitespace a template's own markers hold (tool▁output▁begin, </think>, "\n\n").
TEXT = st.lists(st.sampled_from(["b", "e", "t", "o", "\n", " ", "1", "ok"]), min_size=0, max_size=3).map("".join)
ROLES = st.lists(st.sampled_from(["tool", "user", "system"]), min_size=1, max_size=3)


@pytest.fixture(scope="module")
def renderer_of(renderer_for: Callable[[str], ChatRenderer], load_tokenizer: Callable[[str], Any]):
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


def messages_for(roles: Sequence[str], texts: Sequence[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The appended messages and the assistant turn before them (one call per tool message, else a text turn)."""
    calls = [
        {"id": f"call{n:05d}", "type": "function", "function": {"name": "calculator", "arguments": {"x": str(n)}}}
        for n in range(1, roles.count("tool") + 1)
    ]
    msgs: list[dict[str, Any]] = []
    n = 0
    for role, text in zip(roles, texts, strict=False):
        if role == "tool":
            n += 1
            msgs.append({"role": "tool", "content": text, "tool_call_id": f"call{n:05d}", "name": "calculator"})
        else:
            msgs.append({"role": role, "content": text})
    assistant: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": calls} if calls else {}
    return msgs, assistant or {"role": "assistant", "content": "Hi"}


def next_prompt(
    r: ChatRenderer, p: TemplateProfile, assistant: dict[str, Any], msgs: list[dict[str, Any]]
) -> list[int] | str:
    """The prompt after appending ``msgs``, or the refusal's text."""
    t = TokenTrajectory(r, p)
    try:
        t.start(PROMPT, TOOLS)
    except TemplateError as exc:
        return f"first prompt refused: {exc}"
    role = str(msgs[0]["role"])
    close = p.boundary(role).close_ids if role in {b.next_role for b in p.boundaries} else p.boundary(END).close_ids
    t.add_sampled([*r.encode("x"), *close], None, message=assistant)
    before = list(t.input_ids)
    try:
        return list(t.append_messages(msgs))
    except (TemplateError, TrajectoryError) as exc:
        assert list(t.input_ids) == before, "a refused append changed the stream"
        assert str(exc), "a refusal names the problem"
        return str(exc)


@pytest.mark.parametrize("case", TEMPLATE_CASES)
def test_appended_text_reaches_the_next_prompt_or_the_append_is_refused(renderer_of, case):
    r = renderer_of(case)
    p = probe_template(r)
    counts = {"accepted": 0, "refused": 0}

    @settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(roles=ROLES, texts=st.lists(TEXT, min_size=3, max_size=3))
    def holds(roles, texts):
        msgs, assistant = messages_for(roles, texts)
        got = next_prompt(r, p, assistant, msgs)
        if isinstance(got, str):
            counts["refused"] += 1
            return
        counts["accepted"] += 1
        for k, m in enumerate(msgs):
            changed = [dict(x) for x in msgs]
            changed[k]["content"] = f"{m['content']}Zq{k}"
            twin = next_prompt(r, p, assistant, changed)
            assert twin != got, f"appended message {k} ({m['role']}, {m['content']!r}) was dropped: {roles}"

    holds()
    assert counts["accepted"] + counts["refused"] > 0


HOISTING = ("deepseek-ai-DeepSeek-V3.1", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B")


@pytest.mark.parametrize("name", HOISTING)
@pytest.mark.parametrize("system_text", ["b", "\n", "e", "Be brief."])
def test_a_system_message_appended_with_a_tool_result_on_a_hoisting_template_is_refused(name, system_text):
    """The issue's reproduction: after a tool call, ``[tool, system]`` on a template that writes system messages at
    the top. A short system text ("b") is found in the template's own ``<｜tool▁output▁begin｜>``; a whitespace-only
    one has no text to find: both were appended without their text and without an error."""
    r = template_renderer(name)
    p = probe_template(r)
    calls = [{"id": "call00001", "type": "function", "function": {"name": "calculator", "arguments": {"x": "1"}}}]
    assistant = {"role": "assistant", "content": "", "tool_calls": calls}
    tool = {"role": "tool", "content": "bet", "tool_call_id": "call00001", "name": "calculator"}
    for appended in ([tool, {"role": "system", "content": system_text}], [{"role": "system", "content": system_text}]):
        got = next_prompt(r, p, assistant, appended)
        assert isinstance(got, str) and "'system'" in got, r.decode(got) if isinstance(got, list) else got
    assert isinstance(next_prompt(r, p, assistant, [tool]), list)
