"""Chat-template variants nobody shipped: every fixture template's tool-call whitespace edited, on two tokenizers.

From each template that renders tool calls (``call_reader_cases.LEARNED``) the generator derives variants by editing
the template's SOURCE generically, never per model: the call markers are the control-like chunks of the ``CallForm``
the derived reader learns from the template (``opener``/``lead`` start a call, ``trail``/``closer`` end it), and an
edit changes the whitespace the template writes next to them, inside the Jinja string literal (or raw text) that
holds the marker (``EDITS``: before the first call, between calls, after the last, before the section close and the
turn close; the section left unclosed; call ids not rendered). A variant is kept only where the edited template still
compiles, renders a tool-call turn other than the original's, and the derived reader learns it; every variant not
kept is recorded with why (``skipped``).

Each kept variant comes on two tokenizers (``KINDS``): ``special``, where the call markers are tokens (the template's
own tokenizer, or a shipped base given the template's markers and its call markers as special tokens), and
``plain``, where only the turn markers are tokens and the call markers are plain text (a base whose vocabulary holds
none of them: Mistral v0.3, or Qwen3 for DeepSeek's full-width markers): whitespace next to a plain marker merges
with the marker's last characters into other tokens, which a generator adding every marker as a token would hide.

A variant is named ``TEMPLATE:EDIT:KIND`` (``Variant.name``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from call_reader_cases import LEARNED, PROMPT, TOOLS, assistant_message, case_renderer, rendered_turn
from template_fixtures import BASES, TEMPLATE_KWARGS, markers, template_path, tokenizer_with

from verl_ext.core.call_reader import learn_call_reader
from verl_ext.core.call_reader.literals import MARKER
from verl_ext.core.rendering import ChatRenderer

SHIPPED_CASES = ("qwen3", "qwen2.5", "gpt-oss", "mistral-7b-v0.3")
KINDS = ("special", "plain")
# Jinja tags: inside one, a marker sits in a string literal (whitespace is written as an escape or as itself).
_TAG = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}", re.S)
# Whitespace a template writes in a literal: an escape or the character itself.
_WS = r"(?:\\n|\\t|[ \t\n])"
_CALL_LOOP = re.compile(r"\{%-?\s*for\s+(\w+)\s+in\s+[^%]*tool_calls[^%]*-?%\}")
_FOR_OR_END = re.compile(r"\{%-?\s*(for|endfor)\b[^%]*-?%\}")
_WS_LITERAL = re.compile(r"""(?<=\{\{-\s)(['"])(?:\\n|\\t|[ \t])+\1|(?<=\{\{\s)(['"])(?:\\n|\\t|[ \t])+\2""")
_ID_EXPR = r"\w+(?:\.id|\[['\"]id['\"]\])"
_ID_FIELD = re.compile(
    r"(?P<label>,\s*\\?\"id\\?\":\s*\\?\"|\[CALL_ID\])(?P<q>['\"])\s*\+\s*" + _ID_EXPR + r"\s*\+\s*(?P=q)\\?\"?"
)


@dataclass(frozen=True)
class Markers:
    """Where a template's calls start and end, learned from its renders (marker text as the template writes it)."""

    start: str  # the section opener's first marker, else each call's first
    call_end: str  # the last marker of each call ("" where a call ends in no marker: JSON lists)
    section_close: str  # the marker closing the section of calls ("" where there is none)
    turn_close: str  # the text of the close the template writes after a turn (``<|im_end|>``, ``</s>``)
    call_markers: tuple[str, ...]  # every control marker of the form

    @property
    def end(self) -> str:
        """The marker after the last call: the section's close, else the call's end."""
        return self.section_close or self.call_end


def _form_markers(r: ChatRenderer, profile: Any) -> Markers | None:
    form = learn_call_reader(r, profile).reader
    if form is None:
        return None
    f = form.form

    def ctl(chunks: tuple[str, ...]) -> list[str]:
        return [c for c in chunks if MARKER.fullmatch(c) and not c.startswith("<function")]

    opener, lead, trail, closer = ctl(f.opener), ctl(f.lead), ctl(f.trail), ctl(f.closer)
    start = (opener or lead or [""])[0]
    closes = [r.decode([i]) for i in sorted(profile.close_id_set)]
    every = tuple(dict.fromkeys([*opener, *lead, *trail, *closer, *ctl(f.mid)]))
    return Markers(start, (trail or [""])[-1], (closer or [""])[-1], closes[0] if closes else "", every)


def _in_tag(source: str) -> list[tuple[int, int]]:
    return [m.span() for m in _TAG.finditer(source)]


def _inside(spans: list[tuple[int, int]], at: int) -> bool:
    return any(a <= at < b for a, b in spans)


def _after_messages(source: str) -> int:
    """Where the messages loop starts: edits leave the tool list in the system prompt (written before it) alone."""
    m = re.search(r"\{%-?\s*for\s+\w+\s+in\s+(?:loop_)?messages\b", source)
    return m.start() if m else 0


def _call_loop(source: str) -> tuple[int, int] | None:
    """The span of the template's loop over a message's tool calls (the first one after the messages loop)."""
    for m in _CALL_LOOP.finditer(source, _after_messages(source)):
        depth = 0
        for t in _FOR_OR_END.finditer(source, m.start()):
            depth += 1 if t.group(1) == "for" else -1
            if depth == 0:
                return m.start(), t.end()
    return None


def _insert_at(source: str, marker: str, text: str, before: bool, first_only: bool = False, begin: int = 0) -> str:
    """``text`` written next to every occurrence of ``marker`` after ``begin`` (inside a literal: as an escape;
    in raw template text: as an expression, which Jinja's ``{%-`` trimming cannot remove)."""
    if not marker:
        return source
    spans, out, at = _in_tag(source), [], 0
    escaped = text.replace("\n", "\\n")
    for m in re.finditer(re.escape(marker), source):
        if m.start() < begin:
            continue
        where = m.start() if before else m.end()
        out.append(source[at:where])
        out.append(escaped if _inside(spans, m.start()) else "{{ '" + escaped + "' }}")
        at = where
        if first_only:
            break
    return "".join(out) + source[at:]


def _strip_next_to(source: str, marker: str, before: bool) -> str:
    """The whitespace the template writes right before (or after) ``marker`` in the same literal, removed."""
    if not marker:
        return source
    start = _after_messages(source)
    pattern = _WS + "+" + re.escape(marker) if before else re.escape(marker) + _WS + "+"
    head, tail = source[:start], source[start:]
    return head + re.sub(pattern, marker.replace("\\", "\\\\"), tail)


def _loop_whitespace(source: str, replacement: str) -> str:
    """Whitespace-only literals the tool-call loop writes (Qwen's ``{{- '\\n' }}`` between calls) replaced."""
    span = _call_loop(source)
    if span is None:
        return source
    a, b = span
    body = _WS_LITERAL.sub(lambda m: m.group()[0] + replacement + m.group()[0], source[a:b])
    return source[:a] + body + source[b:]


def _turn_close_after_calls(source: str, m: Markers) -> str:
    span = _call_loop(source)
    begin = span[1] if span else _after_messages(source)
    return _insert_at(source, m.turn_close, "\n", before=True, first_only=True, begin=begin)


def _unclosed(source: str, m: Markers) -> str:
    if not m.section_close:
        return source
    start = _after_messages(source)
    return source[:start] + source[start:].replace(m.section_close, "")


def _no_ids(source: str, m: Markers) -> str:
    span = _call_loop(source)
    if span is None:
        return source
    a, b = span
    return source[:a] + _ID_FIELD.sub(lambda x: x.group("q") + " + " + x.group("q"), source[a:b]) + source[b:]


# Edit class -> the edit of a template's source given its markers (identity where it does not apply: such a variant
# renders as the original and is skipped with that reason).
EDITS: dict[str, Callable[[str, Markers], str]] = {
    "original": lambda s, m: s,  # the template as it is: the baseline each edit is compared with
    "space-before-first": lambda s, m: _insert_at(s, m.start, " ", True, begin=_after_messages(s)),
    "newline-before-first": lambda s, m: _insert_at(s, m.start, "\n", True, begin=_after_messages(s)),
    "no-space-before-first": lambda s, m: _strip_next_to(s, m.start, before=True),
    "no-space-inside-call": lambda s, m: _strip_next_to(_strip_next_to(s, m.start, False), m.call_end, True),
    "no-space-between": lambda s, m: _loop_whitespace(s, ""),
    "newline-between": lambda s, m: _loop_whitespace(s, "\\n\\n"),
    "newline-after-last": lambda s, m: _insert_at(s, m.end, "\n", False, begin=_after_messages(s)),
    "no-space-after-last": lambda s, m: _strip_next_to(s, m.end, before=False),
    "newline-before-section-close": lambda s, m: _insert_at(s, m.section_close, "\n", True, begin=_after_messages(s)),
    "newline-before-close": _turn_close_after_calls,
    "unclosed-section": _unclosed,
    "no-ids": _no_ids,
}


@dataclass(frozen=True)
class Variant:
    """One generated template: its origin, edit class, tokenizer kind and edited source."""

    template: str  # a ``LEARNED`` case
    edit: str
    kind: str
    source: str = field(repr=False)

    @property
    def name(self) -> str:
        """``TEMPLATE:EDIT:KIND``."""
        return f"{self.template}:{self.edit}:{self.kind}"


def template_source(case: str) -> str:
    """The template text of a ``LEARNED`` case."""
    if case.startswith("templates/"):
        return template_path(case.split("/", 1)[1]).read_text(encoding="utf-8")
    return case_renderer(case).chat_template


def _template_kwargs(case: str) -> dict[str, Any]:
    return dict(TEMPLATE_KWARGS.get(case.split("/", 1)[1], {})) if case.startswith("templates/") else {}


@cache
def _plain_tokenizer(case: str, specials: tuple[str, ...], call_markers: tuple[str, ...]) -> Any | str:
    """A shipped base with only ``specials`` added, whose vocabulary holds no call marker; a text: why none is."""
    from verl_ext.demo.run import shipped_tokenizers

    stem = case.split("/", 1)[-1]
    bases = ["qwen3", "mistral-7b-v0.3"] if any("▁" in s for s in call_markers) else ["mistral-7b-v0.3", "qwen3"]
    for base in bases:
        tok = tokenizer_with(shipped_tokenizers()[base], specials)
        vocab = tok.get_vocab()
        if any(m in vocab for m in call_markers):
            continue
        if stem in BASES:
            tok.add_special_tokens({"bos_token": BASES[stem][1], "eos_token": BASES[stem][2]})
        tok.name_or_path = f"{base}+{stem}:plain"
        return tok
    return f"every base's vocabulary holds one of the call markers {list(call_markers)}"


@cache
def _special_tokenizer(case: str, specials: tuple[str, ...]) -> Any:
    """The case's own tokenizer, with any call marker it lacks (and a fixture template's markers) as special."""
    base = case_renderer(case).tokenizer
    vocab = base.get_vocab()
    missing = [s for s in specials if s not in vocab]
    if not missing:
        return base
    from verl_ext.demo.run import shipped_tokenizers

    stem = case.split("/", 1)[-1]
    folder = BASES.get(stem, ("mistral-7b-v0.3",))[0] if case.startswith("templates/") else case.split("/")[0]
    tok = tokenizer_with(shipped_tokenizers()[folder], specials)
    if stem in BASES:
        tok.add_special_tokens({"bos_token": BASES[stem][1], "eos_token": BASES[stem][2]})
    tok.name_or_path = f"{folder}+{stem}:special"
    return tok


@cache
def original_markers(case: str) -> Markers | None:
    """The markers of a case's original template, on its own tokenizer."""
    from verl_ext.core.probe import probe_template

    r = case_renderer(case)
    return _form_markers(r, probe_template(r))


def renderer(variant: Variant) -> ChatRenderer | str:
    """The variant's renderer on its tokenizer kind; a text: why it cannot be built."""
    m = original_markers(variant.template)
    assert m is not None, variant.template
    text = template_source(variant.template)
    turn = [s for s in markers(text) if s not in m.call_markers]
    if variant.kind == "special":
        tok = _special_tokenizer(variant.template, tuple(dict.fromkeys([*markers(text), *m.call_markers])))
    else:
        tok = _plain_tokenizer(variant.template, tuple(turn), m.call_markers)
        if isinstance(tok, str):
            return tok
    return ChatRenderer(tok, chat_template=variant.source, template_kwargs=_template_kwargs(variant.template))


EXAMPLE_CALLS = [("calculator", {"expression": "1+2"}), ("web_search", {"expression": "Paris"})]


def _example_render(r: ChatRenderer, profile: Any) -> str | None:
    return rendered_turn(r, profile, assistant_message(profile, EXAMPLE_CALLS, content="Let me see."))


@dataclass(frozen=True)
class Built:
    """A kept variant: its renderer, profile and the reader derived from it."""

    variant: Variant
    renderer: ChatRenderer
    profile: Any
    reader: Any
    markers: Markers


def build(variant: Variant) -> Built | str:
    """The variant built and learned; a text: why it is skipped (it does not render, or renders as the original,
    or the derived reader learns nothing from it)."""
    from verl_ext.core.probe import probe_template
    from verl_ext.core.template_profile import Verdict

    r = renderer(variant)
    if isinstance(r, str):
        return r
    try:
        profile = probe_template(r)
    except Exception as exc:  # a template the edit broke: recorded, not raised
        return f"the edited template does not render: {type(exc).__name__}: {str(exc)[:120]}"
    if profile.verdict is Verdict.UNSUPPORTED:
        return "verl_ext refuses the edited template: " + "; ".join(x.text[:100] for x in profile.reasons)[:200]
    learned = learn_call_reader(r, profile)
    if learned.reader is None:
        return f"the derived reader learns nothing from it: {learned.why[:160]}"
    m = _form_markers(r, profile)
    assert m is not None
    return Built(variant, r, profile, learned.reader, m)


def variants(cases: Any = None) -> Iterator[tuple[Variant, str]]:
    """Every (variant, why it is skipped: "" where kept) of ``cases`` (default every ``LEARNED`` case), on both
    tokenizer kinds; an edit that changes nothing a tool-call turn renders is skipped with that reason."""
    from verl_ext.core.probe import probe_template

    for case in sorted(cases or LEARNED):
        m = original_markers(case)
        if m is None:
            continue
        source = template_source(case)
        r0 = case_renderer(case)
        profile = probe_template(r0)  # the original's: an edit is judged by what it renders, not by a new probe
        original = _example_render(r0, profile)
        for edit, how in EDITS.items():
            edited = how(source, m)
            why = ""
            if edit == "original":
                pass
            elif edited == source:
                why = f"{edit} does not apply: no such whitespace or marker in the source"
            else:
                try:
                    r1 = r0.with_chat_template(edited)
                    if _example_render(r1, profile) == original:
                        why = f"{edit} changes nothing a tool-call turn renders"
                except Exception as exc:
                    why = f"the edited template does not render: {type(exc).__name__}: {str(exc)[:120]}"
            for kind in KINDS:
                yield Variant(case, edit, kind, edited), why


@cache
def all_variants(cases: tuple[str, ...] | None = None) -> tuple[tuple[Variant, str], ...]:
    """``variants(cases)``, computed once per process."""
    return tuple(variants(cases))


def variant_path(variant: Variant, folder: Path) -> Path:
    """Where to write a variant's source for a reproducer (``folder/TEMPLATE__EDIT.jinja``)."""
    return folder / f"{variant.template.replace('/', '__')}__{variant.edit}.jinja"


__all__ = ["EDITS", "KINDS", "PROMPT", "TOOLS", "Built", "Markers", "Variant", "all_variants", "build", "variants"]
