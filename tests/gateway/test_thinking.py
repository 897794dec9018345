"""A request's reasoning effort is the chat template's thinking switch: served where it asks for what the gateway
renders, refused (naming the setting the gateway renders and how to start it with the other) where it asks for the
other, refused where the template has no switch; never ignored. Over every fixture template with the tokenizers'
own and the Qwen3 tokenizer, each with its switch on and off: an effort is served exactly when the template, given the
setting the effort asks for, renders the prompt the gateway renders.

And sampling that training decides: a request's temperature (top_p, top_k, seed) that the engine samples otherwise is
served and said so in the answer (``verl_ext.sampling_overridden``, the ``X-Verl-Ext-Sampling-Overridden`` header)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from verl_ext.core.rendering import load_renderer
from verl_ext.core.tokenizer_files import template_variables
from verl_ext.gateway.errors import GatewayError
from verl_ext.gateway.thinking import BOOLEAN_SWITCHES, EFFORTS, LEVEL_SWITCH, check_effort

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = sorted((REPO / "tests" / "fixtures" / "templates").glob("*.jinja"))
PROBE = [{"role": "user", "content": "Hi"}]


def _renderers() -> list[tuple[str, Any]]:
    """Each fixture tokenizer with its own template, and the Qwen3 tokenizer with each fixture template (those that
    render a plain user turn: Hermes' needs tools), each as served, with its switch off, and with gpt-oss's level."""
    from verl_ext.core.errors import TemplateError
    from verl_ext.core.rendering import ChatRenderer

    bases = []
    for folder in sorted(p for p in (REPO / "build" / "tokenizers").iterdir() if p.is_dir()):
        bases.append((folder.name, load_renderer(folder)))
    qwen3 = bases[[name for name, _ in bases].index("qwen3")][1]
    for template in TEMPLATES:
        bases.append((template.stem, ChatRenderer(qwen3.tokenizer, chat_template=template.read_text())))
    out = []
    for name, base in bases:
        try:
            base.render_text(PROBE, None, True)
        except TemplateError:
            continue
        for kwargs in ({}, {"enable_thinking": False}, {"thinking": True}, {"reasoning_effort": "high"}):
            out.append((f"{name} {kwargs}", base.with_template_kwargs(kwargs)))
    return out


def _render(renderer: Any, **kwargs: Any) -> str:
    return renderer.with_template_kwargs({**renderer.template_kwargs, **kwargs}).render_text(PROBE, None, True)


def _switch(renderer: Any) -> str | None:
    """The variable the template reads that changes what it renders: a level's (gpt-oss) or a boolean's."""
    variables = template_variables(renderer.chat_template or "")
    for variable, one, other in [(LEVEL_SWITCH, "low", "high")] + [(v, True, False) for v in BOOLEAN_SWITCHES]:
        if variable in variables and _render(renderer, **{variable: one}) != _render(renderer, **{variable: other}):
            return variable
    return None


def test_an_effort_is_served_exactly_where_its_setting_renders_the_gateways_prompt() -> None:
    served_somewhere = refused_somewhere = 0
    for name, renderer in _renderers():
        rendered = _render(renderer)
        variable = _switch(renderer)
        for effort in EFFORTS:
            try:
                check_effort(renderer, effort, "reasoning_effort")
                served = True
            except GatewayError as exc:
                served = False
                assert exc.status == 400 and exc.param == "reasoning_effort", (name, exc.message)
                assert "leave 'reasoning_effort' out" in exc.message or "leave it out" in exc.message, exc.message
            # the template, given the setting the effort asks for, renders what the gateway renders
            asked = effort if variable == LEVEL_SWITCH else effort != "none"
            expected = variable is not None and _render(renderer, **{variable: asked}) == rendered
            assert served == expected, (name, effort, variable)
            served_somewhere += served
            refused_somewhere += not served
    assert served_somewhere > 20 and refused_somewhere > 100, (served_somewhere, refused_somewhere)


def test_the_refusal_names_the_setting_the_gateway_renders_and_the_other() -> None:
    qwen3 = load_renderer(REPO / "build" / "tokenizers" / "qwen3")
    with pytest.raises(GatewayError) as refused:
        check_effort(qwen3, "none", "reasoning.effort")
    assert refused.value.param == "reasoning.effort"
    assert "enable_thinking=true" in refused.value.message
    assert """--template-kwargs '{"enable_thinking": false}'""" in refused.value.message
    check_effort(qwen3.with_template_kwargs({"enable_thinking": False}), "none", "reasoning_effort")  # served
    with pytest.raises(GatewayError, match="must be one of"):
        check_effort(qwen3, "max", "reasoning_effort")
    with pytest.raises(GatewayError, match="has no thinking switch"):
        check_effort(load_renderer(REPO / "build" / "tokenizers" / "qwen2.5"), "high", "reasoning_effort")


class TrainingSampler:
    """The CPU engine under sampling settings a trainer decides (as verl_ext_gateway_agent's engine samples at verl's
    rollout settings): every turn is sampled at ``decided``, whatever the request asks."""

    def __init__(self, inner: Any, decided: dict[str, Any]) -> None:
        self.inner, self.decided = inner, decided
        self.max_context = inner.max_context
        self.unsupported_sampling = getattr(inner, "unsupported_sampling", ())
        self.seen: list[Any] = []

    async def generate(self, prompt_ids: Any, sampling: Any, **kw: Any) -> Any:
        sampling = dataclasses.replace(sampling, temperature=self.decided["temperature"], top_p=self.decided["top_p"])
        self.seen.append(sampling)
        return await self.inner.generate(prompt_ids, sampling, **kw)

    def decided_sampling(self, session: str) -> dict[str, Any]:
        return dict(self.decided)


def test_a_temperature_training_decides_is_served_and_said_in_the_answer(gateway_parts: dict[str, Any]) -> None:
    from verl_ext.gateway.request import parse_chat_request
    from verl_ext.gateway.response import completion_body
    from verl_ext.gateway.responses_request import parse_responses_request
    from verl_ext.gateway.responses_response import response_body
    from verl_ext.gateway.service import SAMPLING_OVERRIDDEN_HEADER, Gateway
    from verl_ext.runtime import RolloutRuntime

    gateway_parts["script"].turns = ["Hi.<|im_end|>"] * 4
    engine = TrainingSampler(gateway_parts["engine"], {"temperature": 1.0, "top_p": 1.0, "top_k": None})
    runtime = RolloutRuntime.build(gateway_parts["renderer"])
    gateway = Gateway(engine, runtime, gateway_parts["reader"], markers=gateway_parts["markers"])
    body = {"messages": PROBE, "max_tokens": 8, "temperature": 0.2, "top_p": 1.0}
    done = asyncio.run(gateway.complete("s", parse_chat_request(body)))
    assert engine.seen[-1].temperature == 1.0  # sampled at training's temperature
    assert done.sampling_overridden == {"temperature": {"requested": 0.2, "used": 1.0}}  # top_p agreed: not said
    assert completion_body(done, "s", "m")["verl_ext"]["sampling_overridden"] == done.sampling_overridden
    assert done.overridden_header() == {SAMPLING_OVERRIDDEN_HEADER: "temperature=0.2->1.0"}
    request = parse_responses_request({"input": "Hi", "max_output_tokens": 8, "temperature": 0.5, "seed": 3})
    answered = response_body(asyncio.run(gateway.complete("r", request)), "r", "m", request)
    assert answered["temperature"] == 1.0  # the value sampled with, as the Responses object reports it
    assert answered["verl_ext"]["sampling_overridden"] == {
        "temperature": {"requested": 0.5, "used": 1.0},
        "seed": {"requested": 3, "used": None},  # verl's engine is passed no request seed
    }
    # a request that asks for what training samples at, or asks nothing, is told nothing
    plain = asyncio.run(gateway.complete("p", parse_chat_request({"messages": PROBE, "max_tokens": 8})))
    assert plain.sampling_overridden == {} and plain.overridden_header() == {}
    gateway.end_all()


def test_the_worker_engine_says_the_rows_sampling_settings() -> None:
    from verl_ext.plugin.gateway_loop import ServerManagerEngine

    engine = ServerManagerEngine(None, {"temperature": 0.7, "top_p": 0.95, "top_k": -1})
    engine.session_params["validation"] = {"temperature": 0.0, "top_p": 1.0}
    assert engine.decided_sampling("row") == {"temperature": 0.7, "top_p": 0.95, "top_k": -1}
    assert engine.decided_sampling("validation") == {"temperature": 0.0, "top_p": 1.0, "top_k": None}


def _messages_request(thinking: Any, max_tokens: int = 16) -> Any:
    from verl_ext.gateway.anthropic_request import parse_messages_request

    body = {"max_tokens": max_tokens, "messages": [{"role": "user", "content": "Hi"}], "thinking": thinking}
    return parse_messages_request(body)


def test_anthropic_thinking_disabled_is_served_exactly_where_thinking_off_renders_the_gateways_prompt() -> None:
    """The Messages route's ``thinking: {"type": "disabled"}`` is the effort "none", checked as chat's is: over every
    fixture template, served exactly where the template with its switch off renders what the gateway renders."""
    request = _messages_request({"type": "disabled"})
    served_somewhere = refused_somewhere = 0
    for name, renderer in _renderers():
        variable = _switch(renderer)
        try:
            check_effort(
                renderer, request.reasoning_effort, request.reasoning_effort_field, request.reasoning_effort_sent
            )
            served = True
        except GatewayError as exc:
            served = False
            assert exc.status == 400 and exc.param == "thinking", (name, exc.message)
            assert exc.message.startswith("'thinking' ") and "leave" in exc.message, exc.message
        off = False if variable in BOOLEAN_SWITCHES else "none"
        expected = variable is not None and _render(renderer, **{variable: off}) == _render(renderer)
        assert served == expected, (name, variable)
        served_somewhere += served
        refused_somewhere += not served
    assert served_somewhere > 5 and refused_somewhere > 20, (served_somewhere, refused_somewhere)
    assert _messages_request(None).reasoning_effort is None  # not given: the template's own setting, unchecked


def test_anthropic_thinking_disabled_on_a_thinking_gateway_is_refused_naming_the_fix(
    make_gateway: Any, gateway_parts: dict[str, Any]
) -> None:
    """Through the gateway: refused (before any engine call) where it renders ``enable_thinking=true``, served where
    it renders thinking off."""
    request = _messages_request({"type": "disabled"})
    thinking = make_gateway(["The answer.<|im_end|>"])
    with pytest.raises(GatewayError) as refused:
        asyncio.run(thinking.complete("s", request))
    assert refused.value.param == "thinking"
    assert """'thinking' {"type": "disabled"} asks for no reasoning""" in refused.value.message
    assert """--template-kwargs '{"enable_thinking": false}'""" in refused.value.message
    assert thinking.counters["turns"] == 0
    off = gateway_parts["renderer"].with_template_kwargs({"enable_thinking": False})
    done = asyncio.run(make_gateway(["The answer.<|im_end|>"], renderer=off).complete("s", request))
    assert done.message["content"] == "The answer."


def test_anthropic_thinking_enabled_is_served_exactly_where_thinking_on_renders_the_gateways_prompt() -> None:
    """``thinking: {"type": "enabled"}`` (and ``adaptive``) is reasoning at the template's level: over every fixture
    template, served exactly where the template with its switch on (a level template: any level) renders what the
    gateway renders; refused naming ``thinking`` and the fix elsewhere."""
    served_somewhere = refused_somewhere = 0
    for kind in ({"type": "enabled", "budget_tokens": 1024}, {"type": "adaptive"}):
        request = _messages_request(kind, max_tokens=2048)
        for name, renderer in _renderers():
            variable = _switch(renderer)
            try:
                check_effort(
                    renderer, request.reasoning_effort, request.reasoning_effort_field, request.reasoning_effort_sent
                )
                served = True
            except GatewayError as exc:
                served = False
                assert exc.status == 400 and exc.param == "thinking", (name, exc.message)
                assert exc.message.startswith("'thinking' ") and "leave" in exc.message, exc.message
            if variable == LEVEL_SWITCH:
                expected = True  # a level template always reasons: at the level it renders
            else:
                expected = variable is not None and _render(renderer, **{variable: True}) == _render(renderer)
            assert served == expected, (name, variable, kind)
            served_somewhere += served
            refused_somewhere += not served
    assert served_somewhere > 10 and refused_somewhere > 20, (served_somewhere, refused_somewhere)


@pytest.mark.parametrize(
    ("thinking", "param", "words"),
    [
        ({"type": "enabled", "budget_tokens": 1024, "budget": 5}, "thinking.budget", "not a key of a 'enabled'"),
        ({"type": "disabled", "budget_tokens": 1024}, "thinking.budget_tokens", "its keys: 'type'"),
        ({"type": "adaptive", "effort": "high"}, "thinking.effort", "its keys: 'type', 'display'"),
        ({"type": "enabled"}, "thinking.budget_tokens", "got null"),
        ({"type": "enabled", "budget_tokens": 4096}, "thinking.budget_tokens", "max_tokens - 1 (2047)"),
        ({"type": "enabled", "budget_tokens": "1024"}, "thinking.budget_tokens", 'got "1024"'),
        ({"type": "enabled", "budget_tokens": 1024, "display": "omitted"}, "thinking.display", "nothing is redacted"),
        ({"type": "between_tools"}, "thinking.type", "'between_tools' is not served"),
        ({"type": "on"}, "thinking.type", "send 'enabled'"),
        ({"budget_tokens": 1024}, "thinking.type", "None is not served"),
        ("enabled", "thinking", "must be an object"),
    ],
)
def test_anthropic_thinking_keys_are_checked(thinking: Any, param: str, words: str) -> None:
    with pytest.raises(GatewayError) as refused:
        _messages_request(thinking, max_tokens=2048)
    assert refused.value.status == 400 and refused.value.param == param, refused.value.message
    assert words in refused.value.message, refused.value.message


def test_anthropic_thinking_enabled_through_the_sdk(make_gateway: Any, gateway_parts: dict[str, Any]) -> None:
    """The real anthropic SDK: ``enabled`` on a gateway rendering thinking on is served, its ``budget_tokens`` said
    as not honoured (``verl_ext.sampling_overridden``, the header, in a body and in a stream); on a gateway rendering
    thinking off it is refused in Anthropic's error shape, naming the --template-kwargs that serves it."""
    import anthropic

    from verl_ext.gateway.server import ServerThread, create_app
    from verl_ext.gateway.service import SAMPLING_OVERRIDDEN_HEADER

    answer = "<think>\nSum.\n</think>\n\nTwo.<|im_end|>"
    on = ServerThread(create_app(make_gateway([answer] * 4), "m")).start()
    off_renderer = gateway_parts["renderer"].with_template_kwargs({"enable_thinking": False})
    off = ServerThread(create_app(make_gateway([answer] * 4, renderer=off_renderer), "m")).start()
    thinking = {"type": "enabled", "budget_tokens": 1024}
    kwargs = {"model": "m", "max_tokens": 1100, "messages": [{"role": "user", "content": "1+1?"}], "thinking": thinking}
    try:
        sdk = anthropic.Anthropic(base_url=f"{on.url}/sessions/a", api_key="k", max_retries=0)
        raw = sdk.messages.with_raw_response.create(**kwargs)
        reply = raw.parse()
        assert [b.type for b in reply.content] == ["thinking", "text"] and reply.content[0].thinking == "Sum."
        said = {"thinking.budget_tokens": {"requested": 1024, "used": None}}
        assert reply.model_extra["verl_ext"]["sampling_overridden"] == said
        assert raw.headers[SAMPLING_OVERRIDDEN_HEADER] == "thinking.budget_tokens=1024->None"
        stream = anthropic.Anthropic(base_url=f"{on.url}/sessions/b", api_key="k", max_retries=0)
        with stream.messages.stream(**kwargs) as events:
            final = events.get_final_message()
        assert [(b.type, getattr(b, "text", None)) for b in final.content] == [("thinking", None), ("text", "Two.")]
        refused = anthropic.Anthropic(base_url=f"{off.url}/sessions/c", api_key="k", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as bad:
            refused.messages.create(**kwargs)
        body = bad.value.body
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
        assert body["verl_ext"] == {"code": "unsupported", "param": "thinking"}
        message = body["error"]["message"]
        assert message.startswith("""'thinking' {"type": "enabled", "budget_tokens": 1024} asks for reasoning""")
        assert """--template-kwargs '{"enable_thinking": true}'""" in message and "enable_thinking=false" in message
    finally:
        on.stop()
        off.stop()
