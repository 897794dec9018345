"""Which of verl's tool parsers (``multi_turn.format``) reads the tool calls a chat template writes.

Derived from the template, never from a model's name: the probe's tool-call turn is rendered, cut as an engine
returns it (what follows the generation prompt, up to and including the id the turn ends on), and every parser
registered in the installed verl is run on those ids as verl's tool agent runs it. A parser reads the template's
calls when it returns exactly the one call that was rendered (name and arguments). Each kind of assistant turn the
engine can produce is tried (with reasoning, with an empty reasoning block, with none).

Beside verl's parsers, the reader derived from the template (``verl_ext.core.call_reader``) is learned: verl's
parser stays the default, and the derived reader reads the turns it reads no call from (all of them, where no
verl parser reads the template). The fit names which reader serves the template, and the derived reader's proof:
a render of calls read back.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_ext.core.call_reader import Learned, learn_call_reader
from verl_ext.core.errors import TemplateError
from verl_ext.core.probe import PROBE_TOOL_NAME, PROBE_TOOLS
from verl_ext.core.rendering import ChatRenderer
from verl_ext.core.template_profile import TemplateProfile
from verl_ext.core.tool_call_shape import RENDERS_NOTHING

_ARGUMENTS = {"query": "QXARG1"}
_HEADS: tuple[tuple[dict[str, str], ...], ...] = (
    ({"role": "system", "content": "QXSYSTEM"}, {"role": "user", "content": "QXUSERA"}),
    ({"role": "user", "content": "QXUSERA"},),  # for templates that refuse a system message
)
_TURN_KINDS: tuple[tuple[str, str | None], ...] = (
    ("reasoning", "QXREASON"),
    ("empty reasoning", ""),
    ("no reasoning", None),
)


@dataclass(frozen=True)
class ParserFit:
    """The verl tool parsers that read a template's tool calls, and the kinds of turn each reads."""

    verl_version: str
    tried: tuple[str, ...]  # every parser registered in the installed verl
    reads: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # parser -> kinds of turn it reads
    kinds: tuple[str, ...] = ()  # the kinds of turn the template could render
    why_none: str = ""  # when no parser could be tried at all (the template writes no tool call)
    derived: Learned | None = None  # the reader derived from the template (``derived.reader`` None: not learned)

    @property
    def readers(self) -> tuple[str, ...]:
        """The parsers that read the template's calls in at least one kind of turn, best first (most kinds)."""
        return tuple(sorted(self.reads, key=lambda name: (-len(self.reads[name]), name)))

    def summary(self) -> str:
        """One line: ``multi_turn.format=hermes`` (with the kinds of turn where not all), or why none reads them."""
        if self.readers:
            named = []
            for name in self.readers:
                kinds = self.reads[name]
                only = f" (only turns with {', '.join(kinds)})" if set(kinds) != set(self.kinds) else ""
                named.append(f"multi_turn.format={name}{only}")
            return f"{' or '.join(named)} reads this template's tool calls"
        why = f" ({self.why_none})" if self.why_none else ""
        tried = ", ".join(self.tried)
        none = f"none of verl {self.verl_version}'s tool parsers ({tried}) reads this template's tool calls{why}"
        if self.derived_reads:
            return f"{none}; the reader derived from the template reads them (verl_ext's loop and gateway use it)"
        return (
            f"{none}; verl's tool agent and verl_ext's loop need one: register a parser for this format "
            "(verl's ToolParser.register) and name it in multi_turn.format"
        )

    @property
    def derived_reads(self) -> bool:
        """Whether the reader derived from the template reads its calls."""
        return self.derived is not None and self.derived.reader is not None

    def reader_line(self) -> str:
        """Which reader serves the template: verl's (by name), the derived one, or none (with the derived one's
        reason)."""
        derived = self.derived
        if self.readers:
            also = (
                "; the reader derived from the template reads turns it reads no call from"
                if self.derived_reads
                else f"; no reader could be derived from the template ({derived.why})"
                if derived
                else ""
            )
            return f"verl's {self.readers[0]} (multi_turn.format={self.readers[0]}){also}"
        if self.derived_reads and derived is not None and derived.reader is not None:
            return f"derived from the template ({derived.reader.form.describe()})"
        why = derived.why if derived else ""
        return f"none: no verl parser reads the template's calls, and none could be derived ({why})"

    @property
    def reader_failed(self) -> bool:
        """Whether a reader derived from the template reads its own renders wrong (other calls than rendered, or
        call-marker text left in the content): a failure of the audit, in its verdict and exit code."""
        return self.derived is not None and self.derived.failed

    def proof_lines(self) -> list[str]:
        """The derived reader's proof: a render of calls, the calls and the content read back from it (a failed
        reading: what it read, and why it fails)."""
        derived = self.derived
        if derived is None or not (self.derived_reads or derived.failed):
            return []
        read = ", ".join(f"{name}({json.dumps(args)})" for name, args in derived.proof) or "(no call)"
        check = "the calls rendered, and the content the template wrapped"
        check = f"FAILS: {derived.why}" if derived.failed else check
        return [
            f"rendered calls: {derived.example!r}",
            f"read back as:   {read}",
            f"content:        {derived.content!r}",
            f"read-back:      {check}",
        ]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``readers`` (best first), ``reads`` per parser, ``tried``, ``verl_version``, ``summary``."""
        return {
            "readers": list(self.readers),
            "reads": {k: list(v) for k, v in self.reads.items()},
            "tried": list(self.tried),
            "verl_version": self.verl_version,
            "summary": self.summary(),
            "reader": self.reader_line(),
            "derived_reader": {
                "reads": self.derived_reads,
                "form": self.derived.reader.form.describe() if self.derived and self.derived.reader else None,
                "why_not": self.derived.why if self.derived else "",
                "example": self.derived.example if self.derived else "",
                "read_back": [list(c) for c in self.derived.proof] if self.derived else [],
                "content_read_back": self.derived.content if self.derived else "",
                "failed": self.reader_failed,
            },
        }


def tool_parser_fit(renderer: ChatRenderer, profile: TemplateProfile) -> ParserFit:
    """Run every tool parser of the installed verl on the template's own tool-call turn (see the module's doc)."""
    import verl
    from verl.experimental.agent_loop.tool_parser import ToolParser
    from verl.tools.schemas import OpenAIFunctionToolSchema

    names = tuple(sorted(ToolParser._registry))
    fit = ParserFit(verl_version=str(verl.__version__), tried=names)
    derived = learn_call_reader(renderer, profile)
    if profile.tool_call_shape.renders == RENDERS_NOTHING:
        why = "the template writes no tool call, only the message text"
        return ParserFit(fit.verl_version, names, why_none=why, derived=derived)
    turns = {kind: ids for kind, ids in ((k, _turn_ids(renderer, profile, r)) for k, r in _TURN_KINDS) if ids}
    schemas = [OpenAIFunctionToolSchema.model_validate(tool) for tool in PROBE_TOOLS]
    reads: dict[str, tuple[str, ...]] = {}
    for name in names:
        parser = ToolParser.get_tool_parser(name, renderer.tokenizer)
        kinds = tuple(kind for kind, ids in turns.items() if _reads(parser, ids, schemas))
        if kinds:
            reads[name] = kinds
    return ParserFit(fit.verl_version, names, reads, tuple(turns), derived=derived)


def _reads(parser: Any, ids: Sequence[int], schemas: list[Any]) -> bool:
    """Whether ``parser`` returns exactly the probe's one call from ``ids`` (a parser that raises reads nothing)."""
    try:
        _, calls = asyncio.run(parser.extract_tool_calls(list(ids), schemas))
        return len(calls) == 1 and calls[0].name == PROBE_TOOL_NAME and json.loads(calls[0].arguments) == _ARGUMENTS
    except Exception:  # noqa: BLE001 - a parser that fails on this format does not read it
        return False


def _turn_ids(renderer: ChatRenderer, profile: TemplateProfile, reasoning: str | None) -> list[int]:
    """The ids an engine returns for the probe's tool-call turn of this kind (empty when the template renders no
    call): the turn's text after the generation prompt, up to the first id the turn may end on after the call's
    arguments, that id included."""
    call = {"id": "call00001", "type": "function", "function": {"name": PROBE_TOOL_NAME, "arguments": _ARGUMENTS}}
    message: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [call]}
    if reasoning is not None:
        message["reasoning_content"] = message["thinking"] = reasoning
    message = profile.tool_call_shape.conform([message])[0]
    for head in _HEADS:
        try:
            prompt = renderer.render_text(list(head), PROBE_TOOLS, add_generation_prompt=True)
            full = renderer.render_text([*head, message], PROBE_TOOLS, add_generation_prompt=False)
        except TemplateError:
            continue
        # Where the turn continues the prompt: all of it, or (QwQ pre-fills "<think>\n", which the rendered turn
        # drops) up to where the two part, never inside a tag: the model writes at least the turn's text after it.
        cut = len(os.path.commonprefix([prompt, full]))
        if cut < len(prompt) and full.rfind("<", 0, cut) > full.rfind(">", 0, cut):
            cut = full.rfind("<", 0, cut)
        body = full[cut:]
        if "QXARG1" not in body:
            return []
        ids = renderer.encode(body)
        ends = profile.stop_id_set | profile.turn_end_id_set
        start = len(renderer.encode(body[: body.index("QXARG1")]))
        end = next((k for k in range(start, len(ids)) if ids[k] in ends), len(ids) - 1)
        return ids[: end + 1]
    return []
