"""Templates the derived tool-call reader is tested on, and tool calls as models write them.

``case_renderer`` builds the renderer of a case: a shipped tokenizer with its own template, Qwen3's alternative
templates (``qwen3/NAME``), or a fixture template over a tokenizer given its markers (``templates/NAME``,
``template_fixtures.template_renderer``). ``varied_text`` rewrites a template's rendering of calls as models vary
it: JSON objects re-dumped with their keys in another order and other separators, whitespace next to the form's
markers dropped, doubled or changed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hypothesis import strategies as st
from template_fixtures import TEMPLATE_CASES, template_renderer

from verl_ext.core.call_reader import CallReader, ReadCall, ReadTurn
from verl_ext.core.call_reader.literals import MARKER
from verl_ext.core.rendering import ChatRenderer

# Every template that renders tool calls, with the encoding the reader learns for it.
LEARNED: dict[str, str] = {
    "qwen3": "json object",
    "qwen2.5": "json object",
    "gpt-oss": "name then json",
    "mistral-7b-v0.3": "json object",
    "qwen3/qwen3-2504-original": "json object",
    "qwen3/qwen3-coder-30b-a3b-instruct_ollama-gguf": "name then keyed parameters",
    "qwen3/qwen3-next-80b-a3b-instruct_ollama-gguf": "json object",
    "qwen3/qwq-32b": "json object",
    "templates/ByteDance-Seed-OSS": "name then keyed parameters",
    "templates/NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": "json object",
    "templates/Mistral-Small-3.2-24B-Instruct-2506": "name then json",
    "templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": "name then json",
    "templates/deepseek-ai-DeepSeek-V3": "name then json",
    "templates/deepseek-ai-DeepSeek-V3.1": "name then json",
    "templates/fireworks-ai-llama-3-firefunction-v2": "json object",
    "templates/meetkai-functionary-medium-v3.2": "name then json",
    "templates/meta-llama-Llama-3.2-3B-Instruct": "json object",
    "templates/meta-llama-Llama-3.3-70B-Instruct": "json object",
    "templates/mistralai-Mistral-Nemo-Instruct-2407": "json object",
    "templates/moonshotai-Kimi-K2": "name then json",
}
# Templates whose renders hold no readable call, with the reason the reader gives.
NOT_LEARNED: dict[str, str] = {
    "templates/google-gemma-2-2b-it": "renders nothing of a tool call",
    "templates/ibm-granite-granite-3.3-2B-Instruct": "renders nothing of a tool call",
    "templates/microsoft-Phi-3.5-mini-instruct": "renders nothing of a tool call",
    "templates/phi-4-mini-instruct_ollama-gguf": "renders nothing of a tool call",
    "templates/phi-4_ollama-gguf": "renders nothing of a tool call",
    "templates/smollm2-135m-instruct_ollama-gguf": "renders nothing of a tool call",
    "templates/verl-ext-name-only-tool-calls": "renders a call's name but not its arguments",
}
assert set(LEARNED) | set(NOT_LEARNED) == set(TEMPLATE_CASES), "every template case is classified"

TOOL_NAMES = ("calculator", "web_search", "get-weather")
PARAMS: dict[str, str] = {"expression": "string", "count": "integer", "ratio": "number", "exact": "boolean"}
PARAMS_ANY: dict[str, str] = {"filters": "object", "tags": "array", "note": "null"}


def _schema(kind: str) -> dict[str, Any]:
    """A parameter's JSON Schema any template expands: arrays with items, objects with properties, and the null
    parameter declared an object (Hermes' tool_use macro recurses without end on ``"type": "null"``, and verl's
    tool schema needs a type)."""
    nested = {"array": {"items": {"type": "string"}}, "object": {"properties": {"a": {"type": "string"}}}}
    return {"description": f"a {kind}", "type": "object" if kind == "null" else kind, **nested.get(kind, {})}


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": "A test tool.",
            "parameters": {
                "type": "object",
                "properties": {k: _schema(t) for k, t in {**PARAMS, **PARAMS_ANY}.items()},
                "required": [],
            },
        },
    }
    for name in TOOL_NAMES
]
PROMPT = [{"role": "user", "content": "Work it out with the tools."}]

_RENDERERS: dict[str, ChatRenderer] = {}


def case_renderer(case: str) -> ChatRenderer:
    if case not in _RENDERERS:
        from verl_ext.core.rendering import load_tokenizer
        from verl_ext.demo.run import shipped_tokenizers

        if case.startswith("templates/"):
            _RENDERERS[case] = template_renderer(case.split("/", 1)[1])
        elif case.startswith("qwen3/"):
            folder = Path(shipped_tokenizers()["qwen3"])
            template = (folder / "extra_templates" / f"{case.split('/', 1)[1]}.jinja").read_text(encoding="utf-8")
            _RENDERERS[case] = ChatRenderer(load_tokenizer(folder), chat_template=template)
        else:
            _RENDERERS[case] = ChatRenderer(load_tokenizer(shipped_tokenizers()[case]))
    return _RENDERERS[case]


# String values as models write them: words, digits, punctuation, unicode, inner spaces (no outer whitespace: a
# keyed form's value is read without the whitespace around it, as the template's own newlines are).
_WORDS = st.sampled_from(["1+2", "Paris", "a b", "x=1, y=2", "中文", "🙂", 'say "hi"', "a\\b", "3", "true", "{x}"])
_ANY = st.recursive(
    st.one_of(st.integers(-1000, 1000), st.booleans(), _WORDS),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from("abc"), inner, max_size=2)),
    max_leaves=5,
)


@st.composite
def arguments(draw: Any) -> dict[str, Any]:
    """A call's arguments: a string, integer, number and boolean, an object, an array and a null, drawn subsets."""
    values: dict[str, Any] = {
        "expression": draw(_WORDS),
        "count": draw(st.integers(-(10**6), 10**6)),
        "ratio": draw(st.sampled_from([0.5, 2.25, -3.5, 1e-3])),
        "exact": draw(st.booleans()),
        "filters": draw(st.dictionaries(st.sampled_from(["a", "b"]), _ANY, min_size=1, max_size=2)),
        "tags": draw(st.lists(_ANY, min_size=1, max_size=3)),
        "note": None,
    }
    keys = draw(st.lists(st.sampled_from(list(values)), min_size=1, max_size=4, unique=True))
    return {k: values[k] for k in keys}


@st.composite
def calls(draw: Any, several: bool) -> list[tuple[str, dict[str, Any]]]:
    n = draw(st.integers(1, 3)) if several else 1
    return [(draw(st.sampled_from(TOOL_NAMES)), draw(arguments())) for _ in range(n)]


def assistant_message(profile: Any, drawn: Sequence[tuple[str, Mapping[str, Any]]], content: str = "") -> dict:
    message = {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"id": f"call{i + 1:05d}", "type": "function", "function": {"name": n, "arguments": dict(a)}}
            for i, (n, a) in enumerate(drawn)
        ],
    }
    return profile.tool_call_shape.conform([message])[0]


def rendered_turn(
    renderer: ChatRenderer, profile: Any, message: Mapping[str, Any], tools: Sequence[Mapping[str, Any]] = TOOLS
) -> str | None:
    """The text the template renders for ``message`` after the prompt's generation prompt, up to its close; None
    where the template cannot render it (with ``tools``) or renders no continuation of the prompt."""
    try:
        body = renderer.render_text([*PROMPT, message], tools, add_generation_prompt=False)
        head = renderer.render_text(PROMPT, tools, add_generation_prompt=True)
    except Exception:
        return None
    at_b, at_h = body.rfind(PROMPT[0]["content"]), head.rfind(PROMPT[0]["content"])
    if at_b < 0 or at_h < 0:
        return None
    body, head = body[at_b:], head[at_h:]
    # where the turn continues the prompt: all of it, or (QwQ pre-fills "<think>\n", which the rendered turn drops)
    # up to where the two part, never inside a tag
    cut = len(os.path.commonprefix([head, body]))
    if cut < len(head) and body.rfind("<", 0, cut) > body.rfind(">", 0, cut):
        cut = body.rfind("<", 0, cut)
    text = body[cut:]
    cuts = [text.rfind(renderer.decode([c])) for c in profile.close_id_set]
    cuts = [c for c in cuts if c > 0]
    return text[: max(cuts)] if cuts else text  # the close after the calls (harmony ends analysis with <|end|>)


def sampled_turn(renderer: ChatRenderer, profile: Any, message: Mapping[str, Any]) -> str | None:
    """``rendered_turn`` where it is one turn a model samples: None where the template writes a turn's close inside
    it (DeepSeek V3's third call follows <｜end▁of▁sentence｜>, R1-Distill writes content after the calls as a turn
    of its own: a model stops at the close, so no sampled turn holds that text)."""
    text = rendered_turn(renderer, profile, message)
    if text is None:
        return None
    closes = [renderer.decode([c]) for c in profile.close_id_set]
    return None if any(c and c in text for c in closes) else text


# The reasoning split the gateway makes for its client (``gateway.parsing.ReasoningMarkers``): a template's own
# reasoning block before the calls (Qwen3's empty <think>\n\n</think>) is reasoning, not content.
def visible_content(content: str) -> str:
    """A read turn's content as the client gets it: the reasoning block split off as the gateway splits it."""
    from verl_ext.gateway.parsing import ReasoningMarkers

    return ReasoningMarkers("<think>", "</think>").split(content)[1]


def wrapped_content(text: str, content: str) -> str:
    """The content the template wrapped in ``text``: ``content`` where it rendered it, else "" (Mistral's and Llama's
    templates drop the content of a turn with calls)."""
    return content if content and content in text else ""


@st.composite
def varied_calls(draw: Any, text: str, content: str) -> str:
    """``text`` with its calls varied as models vary them (``varied_text``), the content and the reasoning block
    before it as the template wrote them."""
    if content and content in text:
        cut = text.find(content) + len(content)
    else:
        cut = text.rfind("</think>") + len("</think>") if "</think>" in text else 0
    return text[:cut] + draw(varied_text(text[cut:]))


def json_spans(text: str) -> list[tuple[int, int, Any]]:
    """The outermost JSON objects in ``text``: (start, end, value)."""
    decoder = json.JSONDecoder()
    spans, at = [], text.find("{")
    while at >= 0:
        try:
            value, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            at = text.find("{", at + 1)
            continue
        spans.append((at, end, value))
        at = text.find("{", end)
    return spans


_SPACE_BY_MARKER = re.compile(r"\s+(?=" + MARKER.pattern + r")|(?<=[>\]])\s+")


@st.composite
def varied_text(draw: Any, text: str, spaces: bool = True) -> str:
    """``text`` as a model may write it (see the module's doc); ``spaces`` false: JSON re-dumped only."""
    out, at = [], 0
    for start, end, value in json_spans(text):
        out.append(_vary_spaces(draw, text[at:start]) if spaces else text[at:start])
        out.append(_redump(draw, value))
        at = end
    out.append(_vary_spaces(draw, text[at:]) if spaces else text[at:])
    return "".join(out)


def _redump(draw: Any, value: Any) -> str:
    if isinstance(value, dict):
        keys = draw(st.permutations(list(value)))
        value = {k: value[k] for k in keys}
    separators = draw(st.sampled_from([(", ", ": "), (",", ":"), (", ", ":")]))
    return json.dumps(value, ensure_ascii=draw(st.booleans()), separators=separators)


def _vary_spaces(draw: Any, text: str) -> str:
    def one(m: re.Match[str]) -> str:
        return draw(st.sampled_from([m.group(), "", " ", "\n", m.group() * 2]))

    return _SPACE_BY_MARKER.sub(one, text)


def tool_close(profile: Any) -> int:
    """The id the template closes a tool-call turn with (before a tool message)."""
    tool = profile.boundary("tool")
    return tool.close_ids[0] if tool.close_ids else min(profile.close_id_set)


def call_turn_rollout(r: ChatRenderer, profile: Any, text: str, parser: Any, reader: Any) -> tuple[Any, Any]:
    """A rollout as the loop builds it: one turn of ``text`` closed for its tool replies, the replies, an answer."""
    from loop_rollouts import build_loop_rollout

    outputs = [[*r.encode(text), tool_close(profile)], r.encode("The answer is 3.")]
    return build_loop_rollout(
        r,
        profile,
        parser,
        outputs,
        ["3", "4", "5"],
        tools=TOOLS,
        prompt=PROMPT,
        max_parallel_calls=8,
        call_reader=reader,
    )


class ChangesArguments(CallReader):
    """A derived reader that reads the calls, then changes the first call's arguments (the injected misreading)."""

    def read(self, text: str, types: Any = None) -> ReadTurn:
        turn = super().read(text, types)
        if not turn.calls:
            return turn
        first = turn.calls[0]
        changed = {**json.loads(first.arguments), "expression": "changed by the reader"}
        wrong = ReadCall(first.name, json.dumps(changed), first.call_id)
        return dataclasses.replace(turn, calls=(wrong, *turn.calls[1:]))
