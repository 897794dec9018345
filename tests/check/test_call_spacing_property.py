"""Whitespace around tool calls is the template's on any template, its call markers special tokens or plain text.

A model writes its calls in its template's format but spaces them its own way: nothing, a space, a newline or a
blank line before the first call, between calls, after the last and before the turn's close. Where a template's
call markers are plain text to the tokenizer (Hermes' ``<tool_call>`` on a Llama 3 tokenizer), that whitespace
merges with the marker's last characters into other tokens (``>`` against ``>\\n``), so the divergence is
whitespace only once the text is compared, never in the ids. The check must name it (allowed) wherever the template
puts it, and still catch a changed argument, a dropped call or a changed content character in the call's turn.

The generator: a template (Qwen2.5's and three variants of it that write other whitespace around calls, a
Hermes-shaped tool_use template derived from it, Qwen3, Mistral v0.3, DeepSeek V3.1 and R1-Distill, Kimi K2; the
Hermes 2 Pro fixture where it is there) on two tokenizers: one that holds its call markers as special tokens, one
that holds them as plain text (a byte-level BPE whose tokens merge ``>`` and a newline, given only the template's
other markers as special tokens); 1-3 calls in the template's own call text with content before them or not; the
model's spacing at each of the four places. Rollouts are built as the loop builds them (``build_loop_rollout``,
the calls read by the reader derived from the template), then checked. Derandomized.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from functools import cache
from typing import Any

import pytest
from call_reader_cases import assistant_message, call_turn_rollout, rendered_turn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from template_fixtures import TEMPLATES_DIR, _base_dir, markers, template_path, tokenizer_with

from verl_ext.check import Cause, ConsistencyChecker
from verl_ext.check.policy import CheckPolicy
from verl_ext.check.tool_call_compare import call_markers
from verl_ext.core.call_reader import CallReader, ReadCall, ReadTurn, learn_call_reader
from verl_ext.core.call_reader.literals import MARKER
from verl_ext.core.probe import probe_template
from verl_ext.core.rendering import ChatRenderer, load_tokenizer
from verl_ext.demo.run import shipped_tokenizers

SPACES = ("", " ", "\n", "\n\n")
# Two tools with one string parameter: every template here renders them (Hermes' schema macro recurses on a
# null-typed parameter, so the call reader's typed tools do not render there).
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": "A test tool.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string", "description": "e"}}},
        },
    }
    for name in ("calculator", "web_search")
]
PLACES = ("before the first call", "between calls", "after the last call", "before the close")
CONTENT = "Let me work it out."
REASONING_CLOSE = "</think>"
PLAIN_BASE = "gpt-oss"  # byte-level BPE: "</tool_call>\n" is '</', 'tool', '_call', '>\n'
CHATML = ("<|im_start|>", "<|im_end|>")
HERMES_FIXTURE = "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use"


def _shipped_template(name: str) -> str:
    return json.loads((shipped_tokenizers()[name] / "tokenizer_config.json").read_text())["chat_template"]


def _edited(text: str, edits: tuple[tuple[str, str], ...]) -> str:
    for old, new in edits:
        assert old in text, f"the template no longer holds {old!r}: update this variant"
        text = text.replace(old, new)
    return text


QWEN25_CALL_END = "{{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end|>\\n' }}"
# Qwen2.5's template edited to write other whitespace around its calls.
QWEN25_VARIANTS: dict[str, tuple[tuple[str, str], ...]] = {
    "as-is": (),
    # Hermes 2 Pro's spacing as the issue measured it: a newline after the last call, before the close
    "newline-before-close": ((QWEN25_CALL_END, QWEN25_CALL_END.replace("'<|im_end|>\\n'", "'\\n<|im_end|>\\n'")),),
    # a newline after each call (SmolLM3): between calls a blank line, after the last a newline
    "newline-after-each": ((QWEN25_CALL_END, QWEN25_CALL_END.replace("</tool_call>'", "</tool_call>\\n'")),),
    # no whitespace between the content (or the header) and the first call, nor between calls
    "no-newline-before": (('\'\\n<tool_call>\\n{"name": "\'', '\'<tool_call>\\n{"name": "\''),),
}
# Hermes' tool_use traits, derived from Qwen2.5's template: the tool list iterated unguarded (it renders only with
# tools), a tool result's newline before its close written only once more follows (the prompt the engine saw lacks
# it: in the context, not the sampled turn), results under a tool header.
HERMES_SHAPED = (
    ("{%- if tools %}", "{%- if true %}"),
    ("{{- '\\n</tool_response>' }}", "{{- '\\n</tool_response>' }}{%- if not loop.last %}{{- '\\n' }}{%- endif %}"),
    (
        "{{- '<|im_start|>user' }}\n        {%- endif %}\n        {{- '\\n<tool_response>",
        "{{- '<|im_start|>tool' }}\n        {%- endif %}\n        {{- '\\n<tool_response>",
    ),
)


def _is_call_marker(marker: str) -> bool:
    """A marker the template writes around tool calls (made plain text in the plain variant)."""
    text = marker.replace("▁", "_").lower()
    return "tool_call" in text or "tool_sep" in text


@dataclasses.dataclass(frozen=True)
class Case:
    """A template on a tokenizer: how to build its renderer, whether its call markers are special tokens."""

    template: Callable[[], str] | None  # None: the base's own template
    base: str
    special: tuple[str, ...] | None = None  # markers added as special tokens; None: the base's tokenizer as shipped
    bos_eos: tuple[str, str] | None = None


def _fixture(name: str) -> Callable[[], str]:
    return lambda: template_path(name).read_text(encoding="utf-8")


def _fixture_cases(name: str, base: str, bos_eos: tuple[str, str] | None = None) -> dict[str, Case]:
    text = _fixture(name)
    every = tuple(markers(text()))
    plain = tuple(m for m in every if not _is_call_marker(m))
    return {f"{name}@special": Case(text, base, every, bos_eos), f"{name}@plain": Case(text, base, plain, bos_eos)}


def _cases() -> dict[str, Case]:
    qwen25 = lambda: _shipped_template("qwen2.5")  # noqa: E731
    out: dict[str, Case] = {}
    for name, edits in QWEN25_VARIANTS.items():
        text = (lambda e: lambda: _edited(qwen25(), e))(edits)
        # Qwen2.5's own tokenizer holds <tool_call> and </tool_call> as control tokens
        out[f"qwen2.5-{name}@special"] = Case(text if edits else None, "qwen2.5")
        out[f"qwen2.5-{name}@plain"] = Case(text, PLAIN_BASE, CHATML)
    hermes = lambda: _edited(qwen25(), HERMES_SHAPED)  # noqa: E731
    out["hermes-shaped@special"] = Case(hermes, "qwen2.5")
    out["hermes-shaped@plain"] = Case(hermes, PLAIN_BASE, CHATML)
    out["qwen3@special"] = Case(None, "qwen3")
    out["qwen3@plain"] = Case(lambda: _shipped_template("qwen3"), PLAIN_BASE, CHATML)
    mistral = lambda: _shipped_template("mistral-7b-v0.3")  # noqa: E731
    out["mistral@special"] = Case(None, "mistral-7b-v0.3")
    mistral_plain = tuple(m for m in markers(mistral()) if m != "[TOOL_CALLS]")
    out["mistral@plain"] = Case(mistral, PLAIN_BASE, mistral_plain, ("<s>", "</s>"))
    deepseek = ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>")
    out |= _fixture_cases("deepseek-ai-DeepSeek-V3.1", "qwen3", deepseek)
    out |= _fixture_cases("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B", "qwen3", deepseek)
    out |= _fixture_cases("moonshotai-Kimi-K2", "mistral-7b-v0.3")
    if (TEMPLATES_DIR / f"{HERMES_FIXTURE}.jinja").is_file():
        out |= _fixture_cases(HERMES_FIXTURE, PLAIN_BASE, ("<|begin_of_text|>", "<|im_end|>"))
    return out


CASES = _cases()


@cache
def _shipped_tokenizer(base: str) -> Any:
    return load_tokenizer(shipped_tokenizers()[base])


@cache
def _tokenizer(base: str, special: tuple[str, ...], bos_eos: tuple[str, str] | None) -> Any:
    tok = tokenizer_with(_base_dir(base), special)
    if bos_eos is not None:
        tok.add_special_tokens({"bos_token": bos_eos[0], "eos_token": bos_eos[1]})
    return tok


@cache
def _setup(name: str) -> tuple[ChatRenderer, Any, CallReader | None, ConsistencyChecker]:
    case = CASES[name]
    special = case.special
    tok = _shipped_tokenizer(case.base) if special is None else _tokenizer(case.base, special, case.bos_eos)
    r = ChatRenderer(tok, chat_template=case.template() if case.template else None)
    profile = probe_template(r)
    learned = learn_call_reader(r, profile)
    # no reader learned from a fixture (Hermes 2 Pro's probe): the loop reads its calls with verl's hermes parser
    assert learned.reader is not None or name.startswith(HERMES_FIXTURE), f"{name}: no reader: {learned.why}"
    return r, profile, learned.reader, ConsistencyChecker(r, profile, CheckPolicy(mode="warn"))


def test_the_plain_cases_hold_their_call_markers_as_plain_text():
    """The generator's marker kinds are what they say: in a plain case the call markers are no special token (and
    the whitespace after a closer merges into its last token on the byte-level base), in a special case they are."""

    def one_control_token(r: ChatRenderer, text: str) -> bool:
        ids = r.encode(text)
        return len(ids) == 1 and ids[0] in r.control_ids

    r, *_ = _setup("qwen2.5-newline-before-close@plain")
    assert r.encode("</tool_call>\n")[-1] != r.encode("</tool_call>")[-1]  # '>\n', one token
    assert not one_control_token(r, "<tool_call>") and not one_control_token(r, "</tool_call>")
    r, *_ = _setup("qwen2.5-newline-before-close@special")
    assert one_control_token(r, "<tool_call>") and one_control_token(r, "</tool_call>")
    r, *_ = _setup("moonshotai-Kimi-K2@plain")
    assert not one_control_token(r, "<|tool_call_begin|>") and one_control_token(r, "<|im_end|>")


@cache
def _call_block_markers(name: str) -> tuple[str, str] | None:
    """The texts the case's template writes once per call around it (control or tag-shaped), read from its render
    of two calls; None where it writes none (Mistral v0.3's JSON list)."""
    r, profile, *_ = _setup(name)
    drawn = [("calculator", {"expression": "1"}), ("web_search", {"expression": "2"})]
    text = rendered_turn(r, profile, assistant_message(profile, drawn), TOOLS) or ""
    return call_markers(text, [n for n, _ in drawn], MARKER, ["expression"])


def _blocks(text: str, found: tuple[str, str] | None) -> list[tuple[int, int]]:
    """The calls of a turn the template rendered: from each call opener to its closer (``found``), or each JSON call
    object where the template writes no per-call markers."""
    if found is not None:
        opener, closer = found
        out, at = [], text.find(opener)
        while at != -1:
            end = text.find(closer, at) + len(closer)
            out.append((at, end))
            at = text.find(opener, end)
        return out
    decoder, out, at = json.JSONDecoder(), [], text.find("{")
    while at != -1:
        _, end = decoder.raw_decode(text, at)
        out.append((at, end))
        at = text.find("{", end)
    return out


def respaced(text: str, found: tuple[str, str] | None, spaces: dict[str, str], content: str = "") -> str:
    """The template's text of a turn's calls (``text``, no content) with the model's whitespace at each place: before
    the first call (and before the section the calls are in), between calls, after the last and before the close;
    inside each call the template's own; ``content`` first (after a reasoning block the template writes).
    ``found``: the per-call markers (``_blocks``)."""
    blocks = _blocks(text, found)
    assert blocks, f"no call found in {text!r}"
    pre = text[: blocks[0][0]].strip()
    # a reasoning block the template writes before the calls (Qwen3's empty one) is the model's first text
    thought, _, pre = pre.rpartition(REASONING_CLOSE)
    out = [thought + REASONING_CLOSE + "\n\n" if thought else "", content, spaces["before the first call"]]
    out += [pre, spaces["before the first call"]] if pre else []
    for k, (a, b) in enumerate(blocks):
        if k:
            out.append(text[blocks[k - 1][1] : a].strip() + spaces["between calls"])
        out.append(text[a:b])
    post = text[blocks[-1][1] :].strip()
    out += [spaces["after the last call"], post, spaces["before the close"] if post else ""]
    return "".join(out)


_ARGS = st.fixed_dictionaries({"expression": st.sampled_from(["1+2", "Paris", "a b", "中文"])})


@st.composite
def model_turn(draw: Any, name: str) -> tuple[str, list[tuple[str, Any]]]:
    """A tool-call turn as a model writes it on the case's template: content or not, 1-3 calls (1 where the template
    renders one), the template's call text spaced at each place as drawn."""
    r, profile, reader, _ = _setup(name)
    n = draw(st.integers(1, 3)) if reader is None or reader.form.several else 1
    drawn = [(draw(st.sampled_from(["calculator", "web_search"])), draw(_ARGS)) for _ in range(n)]
    calls = rendered_turn(r, profile, assistant_message(profile, drawn), TOOLS)
    assert calls, "the template renders no call turn"
    spaces = {place: draw(st.sampled_from(SPACES)) for place in PLACES}
    content = CONTENT if draw(st.booleans()) else ""
    return respaced(calls, _call_block_markers(name), spaces, content), drawn


class _Mutating(CallReader):
    """The derived reader, then one injected defect: the first call's argument changed, the last call dropped, or a
    character added to the content."""

    def __init__(self, form: Any, how: str) -> None:
        super().__init__(form)
        self.how = how

    def read(self, text: str, types: Any = None) -> ReadTurn:
        turn = super().read(text, types)
        if not turn.calls:
            return turn
        if self.how == "argument":
            first = turn.calls[0]
            changed = json.dumps({**json.loads(first.arguments), "expression": "changed"})
            return dataclasses.replace(turn, calls=(ReadCall(first.name, changed, first.call_id), *turn.calls[1:]))
        if self.how == "dropped":
            return dataclasses.replace(turn, calls=turn.calls[:-1])
        return dataclasses.replace(turn, content=turn.content + "x")


def _hermes(r: ChatRenderer) -> Any:
    from verl.experimental.agent_loop.tool_parser import ToolParser

    return ToolParser.get_tool_parser("hermes", r.tokenizer)


def _rollout(r: ChatRenderer, profile: Any, reader: CallReader | None, text: str) -> tuple[Any, Any]:
    return call_turn_rollout(r, profile, text, None if reader is not None else _hermes(r), reader)


def _renders_content(r: ChatRenderer, profile: Any) -> bool:
    """The template writes the content of a message that calls a tool (Hermes' tool_use drops it: a changed
    content character is then in no render, and no check of the template's text can see it)."""
    message = assistant_message(profile, [("calculator", {"expression": "1"})], "QXCONTENT")
    return "QXCONTENT" in (rendered_turn(r, profile, message, TOOLS) or "")


def _as_object(arguments: Any) -> Any:
    return json.loads(arguments) if isinstance(arguments, str) else arguments


def _shown(result: Any) -> list[tuple[str, int, str, str]]:
    return [(f.cause.value, f.turn, f.stream_text, f.rendered_text) for f in result.findings]


@pytest.mark.parametrize("name", list(CASES))
def test_spacing_around_calls_is_never_a_defect_and_a_changed_call_is(name):
    r, profile, reader, checker = _setup(name)
    # A dropped call where the template writes no per-call markers (Mistral v0.3's one list) is a known miss of the
    # check (test_mutations.KNOWN_MISSES, a strict xfail there), as is a content the template does not render.
    # No reader learned (the Hermes fixture, read by verl's parser): its mutations run on the derived Hermes-shaped
    # template, where one is.
    mutations = ["argument"] if reader is not None else ["none"]
    mutations += ["dropped"] if reader is not None and _call_block_markers(name) is not None else []
    mutations += ["content"] if reader is not None and _renders_content(r, profile) else []

    @settings(max_examples=4, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(model_turn(name), st.sampled_from(mutations))
    def holds(turn, how):
        text, drawn = turn
        lr, rollout = _rollout(r, profile, reader, text)
        first = next(m for m in lr.trajectory.messages if m["role"] == "assistant")
        read = [(c["function"]["name"], _as_object(c["function"]["arguments"])) for c in first.get("tool_calls", [])]
        assert read == drawn, text
        result = checker.check_rollout(rollout, template_view=True)
        assert result.engine_ok and not result.defects, (text, result.summary(), _shown(result))
        if reader is None:
            return
        _, mutated = _rollout(r, profile, _Mutating(reader.form, how), text)
        caught = checker.check_rollout(mutated, template_view=True)
        assert caught.defects, (how, text, _shown(caught))
        assert {f.turn for f in caught.defects} == {0}, (how, text, _shown(caught))

    holds()


def _findings(name: str, text: str) -> list[Any]:
    r, profile, reader, checker = _setup(name)
    _, rollout = _rollout(r, profile, reader, text)
    result = checker.check_rollout(rollout, template_view=True)
    assert result.ok, (result.summary(), _shown(result))
    return list(result.findings)


CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>'


@pytest.mark.parametrize(
    ("name", "text", "place", "wrote", "sampled"),
    [
        # the issue's: the template writes "</tool_call>\n" before the close, the model "</tool_call>" ('>' vs '>\n')
        ("qwen2.5-newline-before-close@plain", CALL, "after the last call, before the close", "\n", ""),
        ("qwen2.5-newline-before-close@special", CALL, "after the last call, before the close", "\n", ""),
        ("qwen2.5-as-is@plain", CALL + CALL, "between calls 1 and 2", "\n", ""),
        ("qwen2.5-as-is@plain", f"{CONTENT} {CALL}", "before the first call", "\n", " "),
        ("qwen2.5-no-newline-before@plain", f"{CALL}\n\n{CALL}", "between calls 1 and 2", "", "\n\n"),
        # the generation prompt's newline, which this template does not write before a call once it is history
        ("qwen2.5-no-newline-before@plain", CALL, "before the first call", "", "\n"),
        ("qwen2.5-as-is@plain", f"{CALL} ", "after the last call, before the close", "", " "),
    ],
)
def test_the_finding_names_the_place(name, text, place, wrote, sampled):
    """Whitespace around calls is ``tool_call_reserialized`` (as on Qwen3, where the markers are tokens), its detail
    naming the place and both spacings."""
    said = f"whitespace only, {place}: the template writes {wrote!r} where the stream has {sampled!r}"
    named = [f for f in _findings(name, text) if said in f.detail]
    assert [f.cause for f in named] == [Cause.TOOL_CALL_RESERIALIZED], said


def test_a_tool_results_newline_written_once_more_follows_is_the_prompts_tail():
    """Hermes' tool_use writes a tool result's newline before its close only once another message follows: every
    prompt the engine saw ends ``</tool_response><|im_end|>``, the final render has ``</tool_response>\n``
    (``'>'`` against ``'>\n'`` on the byte-level base; the newline alone on Mistral's). The stream keeps the prompt
    as the engine saw it: ``prefill_dropped``, the prompt's tail, whitespace only (rule
    ``prompt_tail_whitespace``). A tool result the loop changed by a newline after the engine saw it is still a
    defect, in its turn: it lies before the tail."""
    tail = [f for f in _findings("hermes-shaped@plain", CALL) if f.region != "sampled"]
    assert [(f.cause, f.stream_text, f.rendered_text) for f in tail if f.cause is Cause.PREFILL_DROPPED] == [
        (Cause.PREFILL_DROPPED, ">", ">\n")
    ]
    assert "whitespace only, in the prompt's tail before turn 1: the template writes '\\n'" in tail[0].detail
    r, profile, reader, checker = _setup("hermes-shaped@plain")
    lr, rollout = _rollout(r, profile, reader, CALL)
    messages = [dict(m) for m in rollout.messages]
    at = next(k for k, m in enumerate(messages) if m["role"] == "tool")
    messages[at]["content"] += "\n"  # what the engine saw was "3"
    edited = dataclasses.replace(rollout, messages=tuple(messages))
    result = checker.check_rollout(edited, template_view=True)
    assert result.defects and {f.turn for f in result.defects} == {0}, _shown(result)


_PIECES = [*"<>[]|/_:aZ b\n｜", "<|im_start|>", "<think>", "[TOOL_CALLS]", "<｜tool▁calls▁begin｜>", "_of_"]
_PIECES.append("</tool_call>")


@settings(max_examples=3000, deadline=None, derandomize=True)
@given(
    st.lists(st.sampled_from(_PIECES), max_size=8).map("".join),
    st.lists(st.lists(st.sampled_from(_PIECES), max_size=8).map("".join), min_size=1, max_size=2),
)
def test_a_marker_cut_is_found_as_a_full_scan_finds_it(head, texts):
    """``cuts_a_marker`` skips the scan where ``head`` holds no marker start without its end: the same answer as
    scanning every marker of the joined text, on texts of marker pieces cut anywhere."""
    from verl_ext.check.call_spacing import _MARKER_REACH, cuts_a_marker

    scanned = any(
        m.start() < len(head) < m.end() for text in texts for m in MARKER.finditer(head + text[:_MARKER_REACH])
    )
    assert cuts_a_marker(head, texts) == scanned
