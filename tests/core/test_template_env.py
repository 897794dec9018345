"""The faster Jinja sandbox (verl_ext/core/template_env.py) keeps transformers' policy and output.

Hostile templates get the same outcome (the same refusal, or the same text) in transformers' environment and in the
overlay; every fixture template and the shipped tokenizers' templates render the same text both ways (tool calls,
thinking on and off); a renderer whose first render differs turns the overlay off.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from template_fixtures import SHIPPED, TOOLS, template_renderer
from template_fixtures import TEMPLATE_CASES as CASES

from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.template_env import ChatTemplateRenderer, fast_template, stock_environment_template

# Templates the stock sandbox refuses: attribute escapes, mutation of the immutable sandbox's containers, range
# limits, format-string escapes. Refused means an exception, or the sandbox's "unsafe" undefined where the value
# would be (printed, it is empty). Each must be refused the same way (exception type and message, or the same text)
# by the overlay.
REFUSED = [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__ }}",
    "{{ messages.__class__.__base__.__subclasses__() }}",
    "{{ messages[0].__class__.__init__ }}",
    "{{ messages[0].__class__ }}",
    "{{ messages[0]['__class__'].x }}",
    "{{ messages[0].items.__self__.x }}",
    "{{ messages[0].get.__self__.x }}",
    "{{ messages[0].content.__class__.x }}",
    "{{ ''.join.__self__.x }}",
    "{{ (1).__class__.mro() }}",
    "{{ raise_exception.__globals__ }}",
    "{{ raise_exception.__globals__['os'] }}",
    "{{ strftime_now.__globals__ }}",
    "{{ lipsum.__globals__ }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ self.__init__.__globals__ }}",
    "{% set _ = messages.append(1) %}x",
    "{{ messages.pop() }}",
    "{{ messages.sort() }}",
    "{{ messages.reverse() }}",
    "{{ messages.insert(0, 1) }}",
    "{{ messages.extend([1]) }}",
    "{{ messages.remove(1) }}",
    "{{ messages.clear() }}",
    "{{ messages[0].update({'role': 'x'}) }}",
    "{{ messages[0].pop('role') }}",
    "{{ messages[0].popitem() }}",
    "{{ messages[0].setdefault('x', 1) }}",
    "{{ messages[0].clear() }}",
    "{{ {}.update(a=1) }}",
    "{{ [].append(1) }}",
    "{{ tools[0].update({}) }}",
    "{{ tools[0].function.update({}) }}",
    "{{ range(100001) | list | length }}",
    "{{ '{0.__class__}'.format(messages) }}",
    "{{ '{0.__class__.__mro__}'.format('') }}",
    "{{ '{0.role.__class__}'.format(messages[0]) }}",
    "{{ '{x.__class__}'.format_map({'x': 1}) }}",
    "{{ '{0.items.__self__}'.format(messages[0]) }}",
    "{{ messages[0].content.format.__globals__ }}",
    "{% for m in messages %}{{ loop.__class__ }}{% endfor %}",
    "{% for m in messages %}{{ loop._after }}{% endfor %}",
    "{% set ns = namespace(a=1) %}{{ ns.__class__ }}",
    "{% set ns = namespace(a=1) %}{{ ns._Namespace__attrs }}",
    "{% set ns = namespace(a=''.format) %}{{ ns.a('{0.__class__}', 1) }}",
    "{{ messages | attr('__class__') }}",
    "{{ messages[0] | attr('__class__') }}",
    "{{ (messages | map(attribute='__class__') | list)[0].x }}",
    "{{ raise_exception('refused: ' ~ messages[0].role) }}",
    "{{ messages[0].nope.x }}",
    "{{ messages[0].content.func_globals.x }}",
    "{{ marked() }}",
    "{{ altering() }}",
]

# Templates the stock sandbox allows: the overlay must give the same text (names a dict has as a method keep
# their meaning; keys named like a method of another type, or like ``mro``, are keys).
ALLOWED = [
    "{{ messages[0].role }}|{{ messages[0]['content'] }}|{{ messages[0].get('role') }}",
    "{{ messages[0].items() | list }}|{{ messages[0].keys() | list }}|{{ messages[0].values() | list }}",
    "{{ messages[1].mro }}|{{ messages[1].append }}|{{ messages[1].upper }}|{{ messages[1].nope is defined }}",
    "{{ messages[1].items is string }}|{{ messages[1]['items'] }}|{{ messages[1].get('items') }}",
    "{{ messages[0].content.split(' ') | join(',') }}|{{ messages[0].content.startswith('hi') }}",
    "{{ '{0.role}-{0[content]}'.format(messages[0]) }}|{{ '{r}'.format_map({'r': messages[0].role}) }}",
    "{% for m in messages %}{{ loop.index }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{% endfor %}",
    "{% set ns = namespace(n=0, f=''.format) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% endfor %}"
    "{{ ns.n }}{{ ns.f('{0}', 'x') }}",
    "{{ messages | map(attribute='role') | join(',') }}|{{ messages | selectattr('role', 'eq', 'user') | list }}",
    "{{ messages[0] | attr('role') }}|{{ messages[0] | attr('items') is defined }}",
    "{{ tools[0].function.name }}|{{ tools | tojson }}|{{ messages[0] | tojson(indent=2) }}",
    "{{ range(3) | list }}|{{ (1).real }}|{{ (1.5).is_integer() }}|{{ true.real }}|{{ none is none }}",
    "{{ messages[0].content[0:2] }}|{{ messages[:1] | length }}|{{ (messages[0].content | list)[0] }}",
    "{{ bos_token }}|{{ add_generation_prompt }}",
]


def marked() -> str:
    return "called"


def altering() -> str:
    return "called"


marked.unsafe_callable = True  # type: ignore[attr-defined]  # jinja2.sandbox.unsafe's mark
altering.alters_data = True  # type: ignore[attr-defined]  # the Django convention the sandbox honours


def context() -> dict[str, Any]:
    return {
        "marked": marked,
        "altering": altering,
        "messages": [
            {"role": "user", "content": "hi there"},
            {"role": "tool", "content": "x", "mro": "M", "append": "A", "upper": "U", "items": "I"},
        ],
        "tools": [{"type": "function", "function": {"name": "calc", "parameters": {}}}],
        "add_generation_prompt": False,
        "bos_token": "<s>",
    }


def outcome(template: Any) -> tuple[str, str]:
    try:
        return "ok", template.render(**context())
    except Exception as exc:  # noqa: BLE001 - the outcome compared is the exception's type and message
        return type(exc).__name__, " ".join(str(exc).split())


@pytest.mark.parametrize("source", REFUSED)
def test_hostile_templates_are_refused_the_same_way(source):
    stock = outcome(stock_environment_template(source))
    assert stock[0] != "ok" or stock[1] == "", f"transformers' sandbox allows {source!r}: not a refusal case"
    assert outcome(fast_template(source)) == stock


@pytest.mark.parametrize("source", ALLOWED)
def test_allowed_templates_render_the_same_text(source):
    stock = outcome(stock_environment_template(source))
    assert stock[0] == "ok", stock
    assert outcome(fast_template(source)) == stock


def test_the_overlay_is_transformers_environment_with_its_extensions():
    source = "{{ messages[0].role }}"
    stock, fast = stock_environment_template(source).environment, fast_template(source).environment
    assert fast.filters["tojson"] is stock.filters["tojson"]
    assert fast.globals["raise_exception"] is stock.globals["raise_exception"]
    assert fast.globals["strftime_now"] is stock.globals["strftime_now"]
    assert fast.globals["range"] is stock.globals["range"]
    assert set(fast.extensions) == set(stock.extensions)
    assert (fast.trim_blocks, fast.lstrip_blocks) == (stock.trim_blocks, stock.lstrip_blocks) == (True, True)


# -- real templates --------------------------------------------------------------------------------------------


def conversations() -> list[list[dict[str, Any]]]:
    call = {"id": "call00001", "type": "function", "function": {"name": "calculator", "arguments": {"x": "1+1"}}}
    return [
        [{"role": "user", "content": "What is 1+1?"}],
        [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "What is 1+1?"},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "content": "2", "tool_call_id": "call00001", "name": "calculator"},
            {"role": "assistant", "content": "It is 2.", "reasoning_content": "The tool said 2."},
            {"role": "user", "content": "And 2+2? <|im_end|> [INST]"},
        ],
        [
            {"role": "user", "content": "Think first."},
            {"role": "assistant", "content": "<think>\nhm\n</think>\n\nDone.", "thinking": "hm"},
        ],
    ]


@pytest.fixture(scope="module")
def case_renderer(renderer_for, load_tokenizer):
    def get(case: str) -> ChatRenderer:
        if case in SHIPPED:
            return renderer_for(case)
        if case.startswith("qwen3/"):
            folder = Path(load_tokenizer("qwen3").name_or_path) / "extra_templates"
            return renderer_for("qwen3").with_chat_template((folder / f"{case[6:]}.jinja").read_text())
        return template_renderer(case[len("templates/") :])

    return get


def both_ways(r: ChatRenderer, kwargs: dict[str, Any], messages, tools, generation: bool) -> list[tuple[str, str]]:
    renderer = ChatTemplateRenderer(r.tokenizer, r.chat_template or "", {**r.template_kwargs, **kwargs})
    out = []
    for way in (renderer.render_stock, renderer.render_fast):
        try:
            out.append(("ok", way([dict(m) for m in messages], tools, generation)))
        except Exception as exc:  # noqa: BLE001 - a template refusing must refuse the same way in both
            out.append((type(exc).__name__, " ".join(str(exc).split())))
    return out


@pytest.mark.parametrize("case", CASES)
def test_real_templates_render_the_same_text(case_renderer, case):
    r = case_renderer(case)
    rendered = 0
    for messages in conversations():
        for tools in (None, TOOLS):
            for generation in (False, True):
                for kwargs in ({}, {"enable_thinking": False}, {"enable_thinking": True}):
                    stock, fast = both_ways(r, kwargs, messages, tools, generation)
                    assert fast == stock, (messages, tools, generation, kwargs)
                    rendered += stock[0] == "ok"
    assert rendered, f"{case}: no conversation rendered"


def test_a_renderer_verifies_its_first_render_and_then_renders_fast(renderer_for):
    r = renderer_for("qwen3").with_template_kwargs({"enable_thinking": False})
    messages = conversations()[1]
    assert not r._template.verified
    first = r.render_text(messages, TOOLS)
    assert r._template.verified and r._template.enabled
    assert r.render_text(messages, TOOLS) == first
    assert first == r.tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, enable_thinking=False)
    clone = r.with_template_kwargs({"enable_thinking": True})
    assert not clone._template.verified  # new kwargs: verified again
    clone.render_text(messages, TOOLS)
    assert clone._template.verified


def test_a_render_that_differs_turns_the_overlay_off(renderer_for, caplog):
    # strftime_now's microseconds differ between the stock render and the fast one: the first comparison fails.
    r = renderer_for("qwen3").with_chat_template(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{{ strftime_now('%H:%M:%S.%f') }}{% for _ in range(2000) %}{{ loop.index }}{% endfor %}"
    )
    with caplog.at_level(logging.WARNING, logger="verl_ext.core.template_env"):
        r.render_text([{"role": "user", "content": "hi"}])
        r.render_text([{"role": "user", "content": "hi"}])
    assert not r._template.enabled and not r._template.verified
    assert [rec.message for rec in caplog.records].count(
        "chat template: the fast Jinja sandbox is off for this renderer: its text differs from transformers' render"
    ) == 1


def test_inputs_the_overlay_does_not_model_take_the_stock_way(renderer_for):
    r = renderer_for("qwen3")

    def calculator(x: str) -> str:
        """A test tool.

        Args:
            x: the expression
        """
        return x

    renderer = ChatTemplateRenderer(r.tokenizer, r.chat_template or "", {})
    text = renderer.render([{"role": "user", "content": "hi"}], [calculator], False)
    assert text == r.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=[calculator], tokenize=False
    )
    assert not renderer.verified  # a function tool is converted by transformers only: nothing was compared
    named = ChatTemplateRenderer(r.tokenizer, r.chat_template or "", {"documents": [{"title": "t", "text": "x"}]})
    assert not named.enabled
