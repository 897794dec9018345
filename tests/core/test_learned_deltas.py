"""Learned context deltas (verl_ext/core/learned_deltas.py) on the shipped tokenizers' real templates.

Each learned delta must equal ``render_context_delta`` token for token; where it cannot, the delta is rendered and
the reason recorded (never a silent mismatch). Every test also checks that the learned path was taken where it
should be, so that "always render" cannot pass for "learned correctly".
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from conversations import TOOLS

from verl_ext.core import learned_deltas as learned_module
from verl_ext.core.deltas import render_context_delta
from verl_ext.core.errors import OptionsError
from verl_ext.core.learned_deltas import LearnedDeltas
from verl_ext.core.probe import probe_template
from verl_ext.core.trajectory import RepairKind, TokenTrajectory

FAMILIES = ("qwen3", "qwen2.5", "gpt-oss", "mistral-7b-v0.3")

# Contents whose edges BPE merges differently, quotes and backslashes a JSON-quoting template escapes, whitespace a
# trimming template strips, non-ASCII, and the empty string.
CONTENTS = (
    "2",
    "  leading and trailing spaces  ",
    '{"id": 17, "name": "crate \\"A\\"", "qty": 3}',
    "line one\n\nline two\n",
    "\nstarts with a newline",
    "ends with a newline\n",
    "tab\tinside\t",
    "é中文 🙂 naïve",
    "",
    " ",
    "{x} {{y}} <b>&amp;</b> \\n not a newline",
    "\n".join(f'{{"row": {i}, "v": "{"ab" * i}"}}' for i in range(30)),
)


def _call(n: int) -> dict[str, Any]:
    function = {"name": "calculator", "arguments": {"expression": f"{n}+{n}"}}
    return {"id": f"call{n:05d}", "type": "function", "function": function}


def _calling(n: int, calls: int = 1) -> dict[str, Any]:
    return {"role": "assistant", "content": "", "tool_calls": [_call(n * 10 + k) for k in range(calls)]}


def _result(n: int, content: str) -> dict[str, Any]:
    return {"role": "tool", "content": content, "tool_call_id": f"call{n:05d}", "name": "calculator"}


def _turns(turns: int, seed: int) -> list[tuple[list[dict[str, Any]], dict[str, Any]]]:
    """(messages to append, the assistant turn they follow) for ``turns`` turns of mixed shapes."""
    rng = random.Random(seed)
    out: list[tuple[list[dict[str, Any]], dict[str, Any]]] = []
    for n in range(1, turns + 1):
        kind = n % 4
        if kind == 3:  # a user turn after a plain answer
            out.append(([{"role": "user", "content": rng.choice(CONTENTS)}], {"role": "assistant", "content": "ok"}))
        elif kind == 2:  # two results of two calls to the same tool
            out.append(
                ([_result(n * 10, rng.choice(CONTENTS)), _result(n * 10 + 1, rng.choice(CONTENTS))], _calling(n, 2))
            )
        else:
            out.append(([_result(n * 10, rng.choice(CONTENTS))], _calling(n)))
    return out


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("with_system", [False, True])
def test_learned_equals_rendered_over_many_turns(renderer_for, family, with_system):
    r = renderer_for(family)
    profile = probe_template(r)
    deltas = LearnedDeltas(r, profile, verify_rate=0.0)  # no re-check: what is served is what is compared
    for messages, previous in _turns(60, seed=len(family) + with_system):
        got = deltas.context_delta(messages, TOOLS, previous, with_system)
        expected = render_context_delta(r, profile, messages, TOOLS, previous, with_system)
        assert got.delta == expected, (family, messages)
    # Learned, not rendered: each shape (one tool result, two results, a user turn) renders only on first use.
    assert deltas.stats.unverifiable == 0, deltas._shapes
    assert deltas.stats.rendered == deltas.stats.shapes
    assert deltas.stats.learned == 60 - deltas.stats.shapes
    assert deltas.stats.shapes <= 3


@pytest.mark.parametrize("family", FAMILIES)
def test_trajectory_with_learned_deltas_logs_no_fallback(renderer_for, family):
    """Through the trajectory: learned turns add no edit; the stream's context tokens are the render's."""
    r = renderer_for(family)
    profile = probe_template(r)
    deltas = LearnedDeltas(r, profile, verify_rate=0.0)
    t = TokenTrajectory(r, profile, deltas=deltas)
    t.start([{"role": "user", "content": "What is 1+1? Use the calculator."}], TOOLS)
    for n in range(1, 21):
        calling = _calling(n)
        t.add_sampled(r.encode("x"), None, "length", message=calling)
        content = CONTENTS[n % len(CONTENTS)]
        start = len(t.input_ids)
        t.append_messages([_result(n * 10, content)])
        expected = render_context_delta(r, profile, [_result(n * 10, content)], TOOLS, calling, False)
        assert t.input_ids[start:] == list(expected.close_ids + expected.trailer_ids + expected.context_ids)
    assert [e.kind for e in t.edits if e.kind is RepairKind.DELTA_RENDERED] == []
    assert deltas.stats.learned == 19 and deltas.stats.rendered == 1


def count_renders(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one for each render the learned deltas fall back to or verify with."""
    renders: list[int] = []
    real = learned_module.render_context_delta

    def counting(*args: Any, **kwargs: Any) -> Any:
        renders.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(learned_module, "render_context_delta", counting)
    return renders


@pytest.mark.parametrize("family", FAMILIES)
def test_first_use_of_a_shape_is_verified_against_a_render(renderer_for, family, monkeypatch):
    r = renderer_for(family)
    profile = probe_template(r)
    deltas = LearnedDeltas(r, profile, verify_rate=0.0)
    renders = count_renders(monkeypatch)
    first = deltas.context_delta([_result(10, "first")], TOOLS, _calling(1), False)
    learning = len(renders)
    assert learning >= 2  # learned from renders, then the first use itself rendered and compared
    assert first.rendered_because is None and deltas.stats.rendered == 1 and deltas.stats.learned == 0
    renders.clear()
    second = deltas.context_delta([_result(20, "second")], TOOLS, _calling(2), False)
    assert renders == [] and deltas.stats.learned == 1  # later uses: no render at all
    assert second.delta == render_context_delta(r, profile, [_result(20, "second")], TOOLS, _calling(2), False)


def _qwen25_with_tool_template(renderer_for, tool_branch: str) -> Any:
    """Qwen2.5's renderer with its tool-message branch replaced (a template that misbehaves on purpose)."""
    r = renderer_for("qwen2.5")
    template = r.chat_template
    old = (
        "        {{- '\\n<tool_response>\\n' }}\n        {{- message.content }}\n        {{- '\\n</tool_response>' }}\n"
    )
    assert template.count(old) == 1, "Qwen2.5's tool branch changed; update this test"
    return r.with_chat_template(template.replace(old, tool_branch))


# Prints a marker only for long results: the learned pieces (from short marker contents) miss it.
_LENGTH_DEPENDENT = (
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {%- if message.content|length > 80 %}{{- '[long] ' }}{%- endif %}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
)


def test_a_mismatch_on_first_use_falls_back_to_the_render_with_its_reason(renderer_for):
    r = _qwen25_with_tool_template(renderer_for, _LENGTH_DEPENDENT)
    profile = probe_template(r)
    deltas = LearnedDeltas(r, profile, verify_rate=0.0)
    long = "a long tool result " * 10
    got = deltas.context_delta([_result(10, long)], TOOLS, _calling(1), False)
    assert "[long]" in r.decode(got.delta.context_ids)
    assert got.delta == render_context_delta(r, profile, [_result(10, long)], TOOLS, _calling(1), False)
    assert got.rendered_because and "differs from the template's render (first use)" in got.rendered_because
    assert deltas.stats.unverifiable == 1
    # The shape is rendered from now on, with its reason, even for short results the pieces would get right.
    short = deltas.context_delta([_result(20, "short")], TOOLS, _calling(2), False)
    assert short.rendered_because == got.rendered_because and deltas.stats.learned == 0


def test_a_mismatch_found_by_a_sampled_recheck_falls_back_and_is_logged(renderer_for):
    r = _qwen25_with_tool_template(renderer_for, _LENGTH_DEPENDENT)
    profile = probe_template(r)
    deltas = LearnedDeltas(r, profile, verify_rate=1.0)
    t = TokenTrajectory(r, profile, deltas=deltas)
    t.start([{"role": "user", "content": "Hi"}], TOOLS)
    for n, content in enumerate(["short", "tiny", "a long tool result " * 10, "small"], start=1):
        calling = _calling(n)
        t.add_sampled(r.encode("x"), None, "length", message=calling)
        start = len(t.input_ids)
        t.append_messages([_result(n * 10, content)])
        expected = render_context_delta(r, profile, [_result(n * 10, content)], TOOLS, calling, False)
        assert t.input_ids[start:] == list(expected.close_ids + expected.trailer_ids + expected.context_ids)
    logged = [e for e in t.edits if e.kind is RepairKind.DELTA_RENDERED]
    assert [e.turn for e in logged] == [3, 4]  # the turn that showed the mismatch, and every later one
    assert "sampled re-check" in logged[0].detail and deltas.stats.verified == 1


@pytest.mark.parametrize(("rate", "seed"), [(0.25, 7), (0.1, 123), (0.0, 1), (1.0, 2)])
def test_sampled_reverification_happens_at_the_configured_rate(renderer_for, rate, seed, monkeypatch):
    r = renderer_for("qwen3")
    profile = probe_template(r)
    deltas = LearnedDeltas(r, profile, verify_rate=rate, seed=seed)
    uses = 200
    deltas.context_delta([_result(10, "learn")], TOOLS, _calling(1), False)  # first use: always verified
    renders = count_renders(monkeypatch)
    for n in range(2, uses + 2):
        deltas.context_delta([_result(n * 10, f"result {n}")], TOOLS, _calling(n), False)
    draws = random.Random(seed)
    expected = sum(draws.random() < rate for _ in range(uses)) if rate > 0 else 0
    assert deltas.stats.verified == expected == len(renders)
    assert deltas.stats.learned == uses - expected
    if 0 < rate < 1:
        assert 0.4 * rate * uses < expected < 1.6 * rate * uses  # the draw is a sample, not every or no use


def test_verify_rate_outside_zero_to_one_is_refused(renderer_for):
    r = renderer_for("qwen3")
    with pytest.raises(OptionsError, match=r"verify_rate must be within \[0, 1\]"):
        LearnedDeltas(r, probe_template(r), verify_rate=1.5)


def test_content_that_merges_with_the_trailer_falls_back(renderer_for):
    """A template that writes a tool result right after the assistant's close and its "\\n" trailer: a result
    starting with a newline merges with the trailer ("\\n\\n" is one token), which the learned pieces cannot hold."""
    r = _qwen25_with_tool_template(
        renderer_for, "        {{- message.content }}\n        {{- '<|im_start|>user\\n</tool_response>' }}\n"
    )
    # drop the opener before the first tool result, so that the content follows the trailer directly
    r = r.with_chat_template(r.chat_template.replace("{{- '<|im_start|>user' }}\n        {%- endif %}", "{%- endif %}"))
    profile = probe_template(r)
    boundary = profile.boundary("tool")
    assert r.decode(boundary.trailer_ids) == "\n", boundary
    deltas = LearnedDeltas(r, profile, verify_rate=0.0)
    plain = deltas.context_delta([_result(10, "plain")], TOOLS, _calling(1), False)
    assert plain.rendered_because is None
    again = deltas.context_delta([_result(20, "plain again")], TOOLS, _calling(2), False)
    assert again.rendered_because is None and deltas.stats.learned == 1
    merged = [_result(30, "\nnewline first")]
    got = deltas.context_delta(merged, TOOLS, _calling(3), False)
    assert got.rendered_because and "merges with the close or trailer" in got.rendered_because
    assert got.delta == render_context_delta(r, profile, merged, TOOLS, _calling(3), False)
    assert deltas.stats.learned == 1


@pytest.mark.parametrize("family", FAMILIES)
def test_non_string_content_falls_back_to_the_render(renderer_for, family):
    r = renderer_for(family)
    profile = probe_template(r)
    deltas = LearnedDeltas(r, profile, verify_rate=0.0)
    deltas.context_delta([_result(10, "learned")], TOOLS, _calling(1), False)
    parts = [{"type": "text", "text": "a result in parts"}]
    message = {**_result(20, ""), "content": parts}
    try:
        expected = render_context_delta(r, profile, [message], TOOLS, _calling(2), False)
    except Exception as exc:  # a template that refuses parts must refuse them on the learned path too
        with pytest.raises(type(exc)):
            deltas.context_delta([message], TOOLS, _calling(2), False)
        return
    got = deltas.context_delta([message], TOOLS, _calling(2), False)
    assert got.rendered_because == "message 0 has non-string content: rendered"
    assert got.delta == expected and deltas.stats.learned == 0


def test_mistral_tool_call_id_is_learned_as_a_slot(renderer_for):
    """Mistral v0.3 prints each result's tool_call_id, which changes every turn: one learned shape serves them all
    (keyed by the id's length), each delta the render's; an id that is not plain text is keyed by its value."""
    r = renderer_for("mistral-7b-v0.3")
    profile = probe_template(r)
    deltas = LearnedDeltas(r, profile, verify_rate=0.0)
    for n in range(1, 41):
        messages = [_result(n, f"result {n}")]
        got = deltas.context_delta(messages, TOOLS, _calling(n), False)
        assert got.delta == render_context_delta(r, profile, messages, TOOLS, _calling(n), False)
        assert got.rendered_because is None
    assert f'"call_id": "call{40:05d}"' in r.decode(got.delta.context_ids)
    assert deltas.stats.shapes == 1 and deltas.stats.learned == 39
    odd = [{**_result(41, "odd id"), "tool_call_id": 'call"0041'}]  # 9 characters, one a quote
    got = deltas.context_delta(odd, TOOLS, _calling(41), False)
    assert got.delta == render_context_delta(r, profile, odd, TOOLS, _calling(41), False)
    assert deltas.stats.shapes == 2 and deltas.stats.learned == 39  # a new shape, verified on first use


@pytest.mark.parametrize("family", FAMILIES)
def test_renderer_encode_is_the_tokenizers_encode(renderer_for, family):
    """The learned path and the check encode with ``ChatRenderer.encode`` (the backend without offsets where that is
    the same): its ids must be ``tokenizer.encode``'s, special-token text and edge whitespace included."""
    r = renderer_for(family)
    assert r._backend is not None  # the fast path is taken on every shipped tokenizer
    specials = [r.tokenizer.convert_ids_to_tokens(i) for i in sorted(r.control_ids)[:20]]
    texts = [*CONTENTS, "".join(specials), f" {specials[0]}x{specials[-1]} \n", "a" * 5000]
    for text in texts:
        assert r.encode(text) == list(r.tokenizer.encode(text, add_special_tokens=False)), text


def test_renderer_encode_keeps_the_tokenizers_semantics_when_the_backend_truncates(load_tokenizer):
    """A backend left with truncation set (the wrapper resets it on each call; a direct call would not) is encoded
    through the wrapper, so nothing is cut."""
    import copy

    from verl_ext.core.rendering import ChatRenderer

    tokenizer = copy.deepcopy(load_tokenizer("qwen3"))
    tokenizer.backend_tokenizer.enable_truncation(4)
    r = ChatRenderer(tokenizer)
    text = "one two three four five six seven eight"
    assert len(r.encode(text)) > 4
    assert r.encode(text) == list(tokenizer.encode(text, add_special_tokens=False))


def test_a_field_printed_twice_is_keyed_by_its_value_and_then_rendered_with_the_reason(renderer_for):
    """A template printing tool_call_id twice: not one slot, so each id is its own shape (verified on first use),
    and past a few ids the shape is rendered, saying why; every delta is still the render's."""
    branch = (
        "        {{- '\\n<tool_response>\\n' + message.tool_call_id + ' ' + message.tool_call_id + '\\n' }}\n"
        "        {{- message.content }}\n"
        "        {{- '\\n</tool_response>' }}\n"
    )
    r = _qwen25_with_tool_template(renderer_for, branch)
    profile = probe_template(r)
    deltas = LearnedDeltas(r, profile, verify_rate=0.0)
    reasons = []
    for n in range(1, 13):
        messages = [_result(n, f"result {n}")]
        got = deltas.context_delta(messages, TOOLS, _calling(n), False)
        assert got.delta == render_context_delta(r, profile, messages, TOOLS, _calling(n), False)
        assert f"call{n:05d} call{n:05d}" in r.decode(got.delta.context_ids)
        reasons.append(got.rendered_because)
    assert reasons[:8] == [None] * 8 and deltas.stats.shapes == 8
    assert all(why and "tool.tool_call_id" in why and "change every turn" in why for why in reasons[8:])
