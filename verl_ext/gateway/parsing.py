"""What an assistant turn's sampled ids say: its tool calls (read by verl's tool parsers, as the built-in agent loop
reads them) and its reasoning (split from the content for the client, kept in the stream as sampled)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.plugin.tool_calls import ParsedCall, assistant_message, call_id, malformed_count


@dataclass(frozen=True)
class ParsedTurn:
    """One turn as read: the message for the template (content as sampled, reasoning included), the calls, and the
    number of tool-call blocks the parser saw but could not read."""

    message: dict[str, Any]
    calls: tuple[ParsedCall, ...]
    malformed: int


class ToolCallReader:
    """verl's ``ToolParser`` of a format (``hermes``, ``gpt-oss``, ``qwen3_coder``, ...), as ``verl_ext_tool_agent``
    uses it. verl is imported when a reader is built, not when this module is."""

    def __init__(self, tokenizer: Any, parser_format: str = "hermes") -> None:
        from verl.experimental.agent_loop.tool_parser import ToolParser

        try:
            self.parser = ToolParser.get_tool_parser(parser_format, tokenizer)
        except ValueError as exc:
            known = sorted(ToolParser._registry)
            raise ValueError(f"unknown tool-call format {parser_format!r}; verl's parsers: {known}") from exc
        self.format = parser_format

    @property
    def stop_token_ids(self) -> list[int]:
        """Ids the parser needs the engine to stop on (verl's ``ToolParser.stop_token_ids``)."""
        return list(self.parser.stop_token_ids)

    async def read(
        self, body: Sequence[int], tools: Sequence[Mapping[str, Any]] | None, turn: int, decode: Any, parse: bool
    ) -> ParsedTurn:
        """Read one turn's ids (its end-of-turn stop removed). ``parse`` false (``tool_choice: "none"``, or no
        tools) keeps the whole text as content. ``decode`` turns ids into text (the renderer's)."""
        if not parse:
            return ParsedTurn(assistant_message(decode(body), ()), (), 0)
        content, found = await self.parser.extract_tool_calls(list(body), _schemas(tools))
        calls = tuple(ParsedCall(c.name, c.arguments, c.tool_call_id or call_id(turn, i)) for i, c in enumerate(found))
        malformed = malformed_count(self.parser, decode(body), len(found))
        return ParsedTurn(assistant_message(content, calls), calls, malformed)


def _schemas(tools: Sequence[Mapping[str, Any]] | None) -> list[Any]:
    if not tools:
        return []
    from verl.tools.schemas import OpenAIFunctionToolSchema

    return [OpenAIFunctionToolSchema.model_validate(dict(t)) for t in tools]


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
