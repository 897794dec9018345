"""Rebuild a recorded conversation as a rollout would: the replay (and rollout dump) format.

One JSON object per line (see docs/replay-format.md):
- ``messages``: OpenAI-format messages;
- ``tools`` (optional): OpenAI tool schemas;
- ``chat_template_kwargs`` (optional): passed to the chat template (e.g. ``enable_thinking``);
- ``sampled`` (optional): assistant message index (a string) -> the engine's output ids;
- ``logprobs`` (optional): same keys -> one logprob per output id;
- ``finish`` (optional): same keys -> ``"stop"`` or ``"length"``;
- ``prompt_messages`` (optional): how many messages the first prompt has (chat history with assistant turns).
An assistant message without sampled ids is taken as the model's canonical output.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_ext.core.errors import TemplateError, TrajectoryError
from verl_ext.core.probe import END, probe_template
from verl_ext.core.rendering import ChatRenderer, Message
from verl_ext.core.trajectory import FinishReason, TokenTrajectory


class RecordError(ValueError):
    """A replay record is malformed; the message names the field and the fix."""


def read_json_lines(path: str | os.PathLike[str], what: str, hint: str = "") -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON) for each non-blank line of a JSONL file. A missing file raises
    FileNotFoundError naming ``what``; a line that is not JSON raises RecordError naming file and line."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist")
    with file.open(encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RecordError(f"{path}:{line_no}: not valid JSON ({exc.msg} at column {exc.colno}){hint}") from None
            yield line_no, obj


@dataclass(frozen=True)
class ReplayRecord:
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] | None = None
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    sampled: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    logprobs: Mapping[int, tuple[float, ...]] = field(default_factory=dict)
    finish: Mapping[int, FinishReason] = field(default_factory=dict)
    prompt_messages: int | None = None  # messages in the first prompt; default: up to the first assistant message

    @classmethod
    def from_json(cls, obj: Any, where: str = "record") -> ReplayRecord:
        if not isinstance(obj, Mapping):
            raise RecordError(f"{where}: expected a JSON object with a 'messages' list, got {type(obj).__name__}")
        messages = obj.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RecordError(f"{where}: 'messages' must be a non-empty list of OpenAI-format messages")
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
                raise RecordError(f"{where}: messages[{i}] must be an object with a string 'role'")
        tools = obj.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise RecordError(f"{where}: 'tools' must be a list of tool schemas")
        kwargs = obj.get("chat_template_kwargs") or {}
        if not isinstance(kwargs, Mapping):
            raise RecordError(f"{where}: 'chat_template_kwargs' must be an object")

        def by_index(name: str, convert: Any) -> dict[int, Any]:
            raw = obj.get(name) or {}
            if not isinstance(raw, Mapping):
                raise RecordError(f"{where}: '{name}' must map assistant message indices (strings) to values")
            out: dict[int, Any] = {}
            for key, value in raw.items():
                try:
                    index = int(key)
                except (TypeError, ValueError):
                    raise RecordError(f"{where}: '{name}' key {key!r} is not a message index") from None
                if not 0 <= index < len(messages) or messages[index].get("role") != "assistant":
                    raise RecordError(f"{where}: '{name}' key {key!r} does not point at an assistant message")
                try:
                    out[index] = convert(value)
                except (TypeError, ValueError) as exc:
                    raise RecordError(f"{where}: '{name}'[{key!r}] is invalid: {exc}") from None
            return out

        sampled = by_index("sampled", lambda v: tuple(int(i) for i in v))
        logprobs = by_index("logprobs", lambda v: tuple(float(x) for x in v))
        for index, values in logprobs.items():
            if index not in sampled or len(values) != len(sampled[index]):
                raise RecordError(f"{where}: 'logprobs'[{str(index)!r}] needs one value per id in 'sampled'")
        finish = by_index("finish", FinishReason)
        prompt_messages = obj.get("prompt_messages")
        if prompt_messages is not None and (
            not isinstance(prompt_messages, int) or not 0 < prompt_messages < len(messages)
        ):
            raise RecordError(f"{where}: 'prompt_messages' must be an integer between 1 and {len(messages) - 1}")
        if prompt_messages is not None and messages[prompt_messages].get("role") != "assistant":
            raise RecordError(f"{where}: 'prompt_messages' must point at the first assistant message the rollout made")
        return cls(
            tuple(dict(m) for m in messages),
            tuple(tools) if tools else None,
            dict(kwargs),
            sampled,
            logprobs,
            finish,
            prompt_messages,
        )


def canonical_output(
    renderer: ChatRenderer, messages: Sequence[Message], index: int, tools: Sequence[Mapping[str, Any]] | None = None
) -> list[int]:
    """The template's rendering of assistant ``messages[index]`` after the generation prompt, up to
    and including its end-of-turn token: what the model would have sampled to produce that message."""
    messages = probe_template(renderer).tool_call_shape.conform(messages)
    prompt = renderer.render(messages[:index], tools, add_generation_prompt=True, escape=False).ids
    full = renderer.render(messages[: index + 1], tools, add_generation_prompt=False, escape=False).ids
    if full[: len(prompt)] != prompt:
        # A pre-fill that ends mid-merge (QwQ's "<think>\n" before "\n</think>"): the model samples the text
        # that follows the prompt's text, so encode that when the prompt is a text prefix.
        prompt_text = renderer.render_text(messages[:index], tools, add_generation_prompt=True)
        full_text = renderer.render_text(messages[: index + 1], tools, add_generation_prompt=False)
        if full_text.startswith(prompt_text):
            out = renderer.encode(full_text[len(prompt_text) :])
            trailer = list(probe_template(renderer).boundary(END).trailer_ids)
            return out[: -len(trailer)] if trailer and out[-len(trailer) :] == trailer else out
        raise TemplateError(
            f"message {index}: the generation prompt is not a token prefix of the assistant's rendering, so "
            "its canonical output is undefined; record the engine's output ids under 'sampled'"
        )
    out = list(full[len(prompt) :])
    trailer = list(probe_template(renderer).boundary(END).trailer_ids)
    if trailer and out[-len(trailer) :] == trailer:
        out = out[: -len(trailer)]
    return out


def replay(renderer: ChatRenderer, record: ReplayRecord, extra_stop_ids: Sequence[int] = ()) -> TokenTrajectory:
    """Build the trajectory a rollout would have built for ``record``."""
    renderer = renderer.with_template_kwargs(record.chat_template_kwargs)
    messages = list(record.messages)
    t = TokenTrajectory(renderer, probe_template(renderer, extra_stop_ids))
    first = record.prompt_messages or next(
        (i for i, m in enumerate(messages) if m["role"] == "assistant"), len(messages)
    )
    if first == 0:
        raise RecordError("messages[0] is an assistant message; a rollout starts from a prompt")
    t.start(messages[:first], record.tools)
    i = first
    while i < len(messages):
        output = record.sampled.get(i)
        if output is None:
            output = tuple(canonical_output(renderer, messages, i, record.tools))
        t.add_sampled(output, record.logprobs.get(i), record.finish.get(i, FinishReason.STOP), message=messages[i])
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if j == i + 1 and j < len(messages):
            raise TrajectoryError(
                f"messages[{i}] and messages[{j}] are consecutive assistant turns; a rollout "
                "appends a tool, user or system message between engine calls"
            )
        if j > i + 1:
            t.append_messages(messages[i + 1 : j])
        i = j
    t.finish()
    return t
