"""Template behaviours nobody hand-coded (issue 8): tool-call input conventions, template kwargs, appended text
that never reaches the engine, and a template's limit on tool calls per turn; each on real template text."""

from __future__ import annotations

import dataclasses
import json

import pytest
from rollouts import TOOLS, call, tool_result
from template_fixtures import TEMPLATE_KWARGS, template_renderer

from verl_ext.check import Cause, ConsistencyChecker, EngineCall
from verl_ext.check.inputs import trainer_sample_from_trajectory
from verl_ext.cli.main import main
from verl_ext.core.errors import TemplateError
from verl_ext.core.probe import probe_template
from verl_ext.core.replay import ReplayRecord, replay
from verl_ext.core.template_profile import END, Verdict
from verl_ext.core.tool_call_shape import ARGUMENTS_STRING, RENDERS_NAME, RENDERS_NOTHING, ToolCallShape
from verl_ext.core.trajectory import TokenTrajectory

FIREFUNCTION_KWARGS = TEMPLATE_KWARGS["fireworks-ai-llama-3-firefunction-v2"]
PROMPT = [{"role": "user", "content": "What is 1+1?"}]
CALL_TURN = {"role": "assistant", "content": "", "tool_calls": [call()]}


def test_tool_call_shape_conforms_content_and_arguments():
    shape = ToolCallShape(content_none=True, arguments=ARGUMENTS_STRING)
    (m,) = shape.conform([CALL_TURN])
    assert m["content"] is None and m["tool_calls"][0]["function"]["arguments"] == '{"expression": "1+1"}'
    assert CALL_TURN["content"] == "" and isinstance(CALL_TURN["tool_calls"][0]["function"]["arguments"], dict)


@pytest.mark.parametrize(
    ("template", "content_none", "kwargs"),
    [
        ("deepseek-ai-DeepSeek-V3.1.jinja", False, {}),  # concatenates arguments as a string
        ("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", True, {}),  # content "" renders a stray empty turn
        ("fireworks-ai-llama-3-firefunction-v2.jinja", False, FIREFUNCTION_KWARGS),
        ("meetkai-functionary-medium-v3.2.jinja", False, {}),
    ],
)
def test_string_argument_templates_append_tool_results(template, content_none, kwargs):
    r = template_renderer(template, kwargs)
    p = probe_template(r)
    assert "tool" not in p.unsupported_roles and p.verdict is not Verdict.UNSUPPORTED
    assert p.tool_call_shape == ToolCallShape(content_none, ARGUMENTS_STRING)
    # The loop's message has arguments as a mapping and content "": the trajectory renders it the template's way.
    t = TokenTrajectory(r, p)
    t.start(PROMPT, TOOLS)
    out = r.encode("QXCALL")  # any sampled ids: the trajectory never re-renders them
    t.add_sampled([*out, p.boundary("tool").close_ids[0]], None, message=CALL_TURN)
    ids = t.append_messages([tool_result("QXRESULT")])
    assert "QXRESULT" in r.decode(ids[t.turns[0].sampled_end :])


def test_a_template_that_renders_no_tool_call_can_still_take_tool_results():
    granite = probe_template(template_renderer("ibm-granite-granite-3.3-2B-Instruct.jinja"))
    assert granite.tool_call_shape.renders == RENDERS_NOTHING and "tool" not in granite.unsupported_roles
    phi = probe_template(template_renderer("microsoft-Phi-3.5-mini-instruct.jinja"))
    # unsupported for the true reason: the template renders no tool message at all
    assert "drops the content of an appended 'tool' message" in phi.unsupported_roles["tool"]


def test_shipped_templates_keep_their_tool_call_shape(renderer_for):
    for family in ("qwen3", "qwen2.5", "gpt-oss", "mistral-7b-v0.3"):
        shape = probe_template(renderer_for(family)).tool_call_shape
        assert not shape.content_none and shape.renders == "arguments", family


def test_system_text_moved_to_the_top_is_refused():
    """DeepSeek V3.1 gathers every system message at the top: a system message appended mid-rollout would never
    reach the engine. The probe says so, and the trajectory refuses it naming the role and why."""
    r = template_renderer("deepseek-ai-DeepSeek-V3.1.jinja")
    p = probe_template(r)
    assert "before the assistant turn" in p.unsupported_roles["system"]
    t = TokenTrajectory(r, p)
    t.start(PROMPT, TOOLS)
    t.add_sampled(
        [*r.encode("Hi"), p.boundary("user").close_ids[0]], None, message={"role": "assistant", "content": "Hi"}
    )
    with pytest.raises(TemplateError, match="'system'"):
        t.append_messages([{"role": "system", "content": "Now answer in French."}])
    # Even a profile that claimed the role appendable: the delta is checked for the appended text.
    lenient = dataclasses.replace(
        p, boundaries=(*p.boundaries, dataclasses.replace(p.boundary("user"), next_role="system")), unsupported_roles={}
    )
    t = TokenTrajectory(r, lenient)
    t.start(PROMPT, TOOLS)
    t.add_sampled(
        [*r.encode("Hi"), p.boundary("user").close_ids[0]], None, message={"role": "assistant", "content": "Hi"}
    )
    with pytest.raises(TemplateError, match="does not render the appended 'system' message's text after"):
        t.append_messages([{"role": "system", "content": "Now answer in French."}])


def test_tool_text_through_tojson_is_not_mistaken_for_a_drop():
    """Llama 3.2 writes tool content with `| tojson` (quotes, escaped newlines and <>): that text reached the engine."""
    r = template_renderer("meta-llama-Llama-3.2-3B-Instruct.jinja")
    p = probe_template(r)
    t = TokenTrajectory(r, p)
    t.start(PROMPT, TOOLS)
    t.add_sampled([*r.encode("x"), p.boundary("tool").close_ids[0]], None, message=CALL_TURN)
    t.append_messages([tool_result('a "quoted" <b>\nline')])


def test_two_calls_on_a_single_call_template_are_refused_up_front_and_the_check_does_not_raise():
    r = template_renderer("meta-llama-Llama-3.2-3B-Instruct.jinja")
    p = probe_template(r)
    assert p.parallel_tool_calls is False and "single tool-calls" in p.parallel_tool_calls_error
    two = {"role": "assistant", "content": "", "tool_calls": [call("1+1", 1), call("2+2", 2)]}
    t = TokenTrajectory(r, p)
    t.start(PROMPT, TOOLS)
    t.add_sampled([*r.encode("x"), p.boundary("tool").close_ids[0]], None, message=two)
    with pytest.raises(TemplateError, match="at most one tool call per assistant turn"):
        t.append_messages([tool_result("2", 1), tool_result("4", 2)])
    t.finish()
    turn = t.turns[0]
    calls = [EngineCall.of(t.input_ids[: turn.prompt_length], t.input_ids[turn.sampled_start : turn.sampled_end])]
    result = ConsistencyChecker(r, p).check(
        calls, trainer_sample_from_trajectory(t), t.messages, TOOLS, template_view=True
    )
    (f,) = [f for f in result.findings if f.cause is Cause.TEMPLATE_REFUSED]
    assert f.allowed and "single tool-calls" in f.detail and result.ok


def test_check_template_takes_template_kwargs(tmp_path, capsys):
    """firefunction-v2 needs `functions` and `datetime`: without them the audit fails naming the variable."""
    r = template_renderer("fireworks-ai-llama-3-firefunction-v2.jinja")
    r.tokenizer.save_pretrained(tmp_path / "tok")
    template = str(tmp_path / "t.jinja")
    (tmp_path / "t.jinja").write_text(r.chat_template or "", encoding="utf-8")
    base = ["check-template", str(tmp_path / "tok"), "--chat-template", template]
    assert main([*base, "--json"]) == 2
    assert "functions" in capsys.readouterr().err
    assert main([*base, "--json", "--template-kwargs", json.dumps(FIREFUNCTION_KWARGS)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["template_kwargs"] == FIREFUNCTION_KWARGS and data["tool_call_shape"]["arguments"] == "json string"
    assert main([*base, "--template-kwargs", "{bad"]) == 2
    assert "--template-kwargs '{bad' is not valid JSON" in capsys.readouterr().err
    assert main([*base, "--template-kwargs", "[1]"]) == 2
    assert "must be a JSON object" in capsys.readouterr().err


NAME_ONLY = "verl-ext-name-only-tool-calls"


def test_a_name_only_template_is_probed_and_rolled_out_truthfully():
    """Our own template that writes a call's name and never its arguments (the shape of some trainers' test
    templates): the probe says so, tool results append after the turn's own close, and a rollout keeps the
    engine's call text (arguments included) while the canonical replay is exactly the template's text."""
    r = template_renderer(NAME_ONLY)
    p = probe_template(r)
    assert p.tool_call_shape.renders == RENDERS_NAME and p.tool_call_arguments == "not rendered"
    assert "renders a tool call's name but not its arguments" in [reason.text for reason in p.reasons]
    assert "tool" not in p.unsupported_roles and r.decode(p.boundary("tool").close_ids) == "<|end|>"
    assert r.render_text([*PROMPT, CALL_TURN]).endswith("<|assistant|>\n[call: calculator]<|end|>\n")

    # The engine wrote the arguments too: the trajectory keeps what it sampled, and the result follows the close.
    sampled = r.encode('[call: calculator]{"expression": "1+1"}<|end|>')
    t = TokenTrajectory(r, p)
    t.start(PROMPT, TOOLS)
    t.add_sampled(sampled, None, message=CALL_TURN)
    ids = t.append_messages([tool_result("QXRESULT")])
    assert t.input_ids[t.turns[0].sampled_start : t.turns[0].sampled_end] == sampled
    assert r.decode(ids[t.turns[0].sampled_end :]).startswith("\n<|tool|>\nQXRESULT<|end|>")

    # Canonical: the model wrote what the template writes; the rollout is the template's text and the check is clean.
    chat = [*PROMPT, CALL_TURN, tool_result("2"), {"role": "assistant", "content": "It is 2."}]
    t = replay(r, ReplayRecord.from_json({"messages": chat, "tools": TOOLS}))
    assert t.input_ids + list(p.boundary(END).trailer_ids) == r.encode(r.render_text(chat, TOOLS))
    calls = [
        EngineCall.of(t.input_ids[: turn.prompt_length], t.input_ids[turn.sampled_start : turn.sampled_end])
        for turn in t.turns
    ]
    result = ConsistencyChecker(r, p).check(
        calls, trainer_sample_from_trajectory(t), t.messages, TOOLS, template_view=True
    )
    assert result.ok and not result.defects, [(f.cause.value, f.detail) for f in result.defects]


@pytest.mark.parametrize(
    ("template", "close", "call_markers"),
    [
        ("moonshotai-Kimi-K2", "<|im_end|>", ("<|tool_call_end|>", "<|tool_calls_section_end|>")),
        ("deepseek-ai-DeepSeek-V3.1", "<｜end▁of▁sentence｜>", ("<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>")),
        (
            "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
            "<｜end▁of▁sentence｜>",
            ("<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>"),
        ),
    ],
)
def test_per_call_end_markers_are_not_the_turns_close(template, close, call_markers):
    """Kimi-K2 and DeepSeek end each call (and the call section) with markers of their own before the turn's close:
    the probe takes the turn's close, and a tool-call turn the engine ended on it appends the result after it."""
    r = template_renderer(template)
    p = probe_template(r)
    assert {r.decode(b.close_ids) for b in p.boundaries} == {close}
    assert not {r.encode(m)[0] for m in call_markers} & p.stop_id_set  # never a stop id or a close
    t = TokenTrajectory(r, p)
    t.start(PROMPT, TOOLS)
    message = p.tool_call_shape.conform([CALL_TURN])[0]
    # What the model writes for the call is the template's own rendering of it, up to and including the close.
    rendered = r.render_text([*PROMPT, message], TOOLS)
    body = rendered[len(r.render_text(PROMPT, TOOLS, add_generation_prompt=True)) :]
    sampled = r.encode(body[: body.rindex(close) + len(close)])
    assert all(r.encode(m)[0] in sampled for m in call_markers)
    t.add_sampled(sampled, None, message=CALL_TURN)
    ids = t.append_messages([tool_result("QXRESULT")])
    after = r.decode(ids[t.turns[0].sampled_end :])
    assert "QXRESULT" in after and close not in after.split("QXRESULT")[0]  # no second close before the result


def test_a_template_that_always_writes_the_generation_prompt_closes_on_its_end_token():
    """firefunction-v2 writes "<|start_header_id|>assistant<|end_header_id|>" after every conversation, asked or
    not: the turn's close is <|eot_id|> before every role, not the header that opens the next message."""
    r = template_renderer("fireworks-ai-llama-3-firefunction-v2")
    p = probe_template(r)
    assert {r.decode(b.close_ids) for b in p.boundaries} == {"<|eot_id|>"}
    assert r.decode(p.boundary(END).trailer_ids) == "<|start_header_id|>assistant<|end_header_id|>\n\n"
