"""What an assistant turn's sampled ids say: its tool calls and its reasoning.

The calls are read by ``verl_ext.core.turn_parse.parse_turn``, the function ``verl_ext_tool_agent`` calls, with
verl's tool parser of the same format: the same ids give the same message for the template, the same calls and the
same count of malformed calls. The gateway has no limit on calls per turn: every call the parser read goes to the
client (the client runs the tools; a call left out of the answer would still be in the sampled tokens, and the
client's next request could not match them). The reasoning is split from the content for the client only; the
stream keeps it as sampled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, overload

from verl_ext.core.call_reader import CallReader
from verl_ext.core.turn_end import message_body
from verl_ext.core.turn_parse import ParsedCall, ParsedTurn, assistant_message, parse_turn
from verl_ext.gateway.history import tools_key
from verl_ext.gateway.tool_schema import parser_view

_SCHEMA_LISTS = 64  # tool lists whose schemas are kept (sessions of one gateway usually share one list)


class ToolCallReader:
    """verl's ``ToolParser`` of a format (``hermes``, ``gpt-oss``, ``qwen3_coder``, ...), as ``verl_ext_tool_agent``
    uses it. verl is imported when a reader is built, not when this module is."""

    def __init__(self, tokenizer: Any, parser_format: str = "hermes", call_reader: CallReader | None = None) -> None:
        from verl.experimental.agent_loop.tool_parser import ToolParser

        try:
            self.parser = ToolParser.get_tool_parser(parser_format, tokenizer)
        except ValueError as exc:
            known = sorted(ToolParser._registry)
            raise ValueError(f"unknown tool-call format {parser_format!r}; verl's parsers: {known}") from exc
        self.format = parser_format
        # the reader derived from the template: reads a turn where verl's parser reads no call (the gateway sets it)
        self.call_reader = call_reader
        self._schemas: dict[bytes, list[Any]] = {}  # tools key -> verl's schemas (validated once per tool list)

    @property
    def stop_token_ids(self) -> list[int]:
        """Ids the parser needs the engine to stop on (verl's ``ToolParser.stop_token_ids``)."""
        return list(self.parser.stop_token_ids)

    async def read(
        self,
        ids: Sequence[int],
        end_of_turn_ids: frozenset[int],
        tools: Sequence[Mapping[str, Any]] | None,
        turn: int,
        decode: Callable[[Sequence[int]], str],
        parse: bool,
        generation_prompt: Sequence[int],
    ) -> ParsedTurn:
        """Read one turn's ids as sampled (an end-of-turn stop is not content) with ``parse_turn``, every call
        kept. ``parse`` false (``tool_choice: "none"``, or no tools) keeps the whole text as content: the client
        asked for no calls. ``decode`` turns ids into text (the renderer's); ``generation_prompt`` is the ids the
        template's generation prompt ends a prompt with (a parser may need the header it pre-fills)."""
        if not parse:
            return ParsedTurn(assistant_message(decode(message_body(ids, end_of_turn_ids)), ()), [], [], 0)
        return await parse_turn(
            self.parser,
            ids,
            end_of_turn_ids,
            decode,
            self.schemas(tools),
            turn,
            None,
            generation_prompt=generation_prompt,
            call_reader=self.call_reader,
        )

    def schemas(self, tools: Sequence[Mapping[str, Any]] | None) -> list[Any]:
        """verl's ``OpenAIFunctionToolSchema`` of each tool, as the built-in loop hands its parser; built once per
        tool list (a request repeats its session's tools on every call), from the tool's ``parser_view`` (any tool
        schema the APIs accept, checked by the request, validates)."""
        if not tools:
            return []
        key = tools_key(tools)
        if key not in self._schemas:
            from verl.tools.schemas import OpenAIFunctionToolSchema

            if len(self._schemas) >= _SCHEMA_LISTS:
                del self._schemas[next(iter(self._schemas))]  # the oldest: a bounded cache, not a record
            self._schemas[key] = [OpenAIFunctionToolSchema.model_validate(parser_view(t)) for t in tools]
        return self._schemas[key]


@dataclass(frozen=True)
class ReasoningMarkers:
    """The text that opens and closes a reasoning block in sampled output (Qwen3: ``<think>`` ... ``</think>``)."""

    open: str
    close: str

    def split(self, text: str) -> tuple[str | None, str]:
        """``(reasoning, content)`` of an assistant text, as the chat template splits it on re-render: the
        reasoning between the markers (outer newlines stripped), the content after the close (leading newlines
        stripped). ``(None, text)`` when the text holds no close marker."""
        if self.close not in text:
            return None, text
        head, _, content = text.partition(self.close)
        reasoning = head.split(self.open)[-1] if self.open in head else head
        return reasoning.strip("\n"), content.lstrip("\n")


class ReasoningSplit(Sequence[Mapping[str, Any]]):
    """A request's messages with each assistant message whose content still holds the sampled reasoning split as
    the answer split it (so a harness that echoes the whole text matches too), message by message when read: the
    messages a session does not read are not split. ``raw`` is the list as sent (``MessageList.raw``), or None."""

    def __init__(self, messages: Sequence[Mapping[str, Any]], markers: ReasoningMarkers) -> None:
        self.messages = messages
        self.markers = markers
        self.raw: list[Any] | None = getattr(messages, "raw", None)
        self._read: dict[int, Mapping[str, Any]] = {}

    def __len__(self) -> int:
        return len(self.messages)

    @overload
    def __getitem__(self, index: int) -> Mapping[str, Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[Mapping[str, Any]]: ...

    def __getitem__(self, index: int | slice) -> Mapping[str, Any] | list[Mapping[str, Any]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self.messages)))]
        i = index + len(self.messages) if index < 0 else index
        if i not in self._read:
            message = self.messages[i]
            if message["role"] == "assistant" and self.markers.close in message["content"]:
                reasoning, content = self.markers.split(message["content"])
                message = {**message, "content": content, "reasoning_content": reasoning}
            self._read[i] = message
        return self._read[i]

    def __iter__(self) -> Iterator[Mapping[str, Any]]:
        for i in range(len(self.messages)):
            yield self[i]


def reasoning_markers(tokenizer: Any) -> ReasoningMarkers | None:
    """``<think>``/``</think>`` when the tokenizer has both as tokens of their own, else None (no split)."""
    vocab = tokenizer.get_vocab()
    if "<think>" in vocab and "</think>" in vocab:
        return ReasoningMarkers("<think>", "</think>")
    return None


def visible_message(
    message: Mapping[str, Any], markers: ReasoningMarkers | None, calls: Sequence[ParsedCall], parse: bool
) -> dict[str, Any]:
    """The assistant message as the client gets it (OpenAI shape): content without the reasoning, reasoning as
    ``reasoning_content``, tool calls with their arguments as JSON text."""
    reasoning, content = markers.split(message["content"]) if markers else (None, message["content"])
    out: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        out["reasoning_content"] = reasoning
    if parse and calls:
        out["tool_calls"] = [
            {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls
        ]
    return out
