"""Rebuild a recorded conversation as a rollout would: the replay (and rollout dump) format.

One JSON object per line (see docs/replay-format.md):
- ``messages``: OpenAI-format messages;
- ``tools`` (optional): OpenAI tool schemas;
- ``chat_template_kwargs`` (optional): passed to the chat template (e.g. ``enable_thinking``);
- ``sampled`` (optional): assistant message index (a string) -> the engine's output ids;
- ``logprobs`` (optional): same keys -> one logprob per output id (``"NaN"``, ``"Infinity"``, ``"-Infinity"``: a float
  that is not finite, as record files write it);
- ``finish`` (optional): same keys -> ``"stop"``, ``"length"`` or SGLang's ``finish_reason`` object;
- ``prompt_messages`` (optional): how many messages the first prompt has (chat history with assistant turns);
- ``template_clock`` (optional): the time the template's ``strftime_now`` read in the rollout (ISO 8601).
- ``version`` (optional): the record schema version the line was written for (at most ``SCHEMA_VERSION``).
An assistant message without sampled ids is taken as the model's canonical output. Any other key is refused: a
misspelled ``sampled`` would otherwise replay the template's output instead of the engine's ids.
"""

from __future__ import annotations

import difflib
import json
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from verl_ext.core.engine_output import NAN_HAPPENED, reports_nan
from verl_ext.core.errors import IsAFolderError, MissingFileError, TemplateError, TrajectoryError, VerlExtError
from verl_ext.core.messages import first_message_problem, json_type
from verl_ext.core.probe import probe_template
from verl_ext.core.rendering import ChatRenderer, Message, parse_clock
from verl_ext.core.template_profile import END
from verl_ext.core.trajectory import FinishReason, TokenTrajectory


class RecordError(VerlExtError, ValueError):
    """A replay record is malformed; the message names the field and the fix."""


# Strict JSON has no NaN or Infinity: record files (schema version 2, ``verl_ext.check.record``) write a float that
# is not finite as one of these strings, and every float field of the replay format reads them back.
NON_FINITE_JSON: dict[str, float] = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

# The record schema version (``verl_ext.check.record`` documents each): the replay format is its subset, so a replay
# line may carry the version of the record file it came from; a newer one is refused, not guessed at.
SCHEMA_VERSION = 7

# The replay format's keys, in the order docs/replay-format.md documents them.
REPLAY_KEYS = (
    "messages",
    "tools",
    "chat_template_kwargs",
    "sampled",
    "logprobs",
    "finish",
    "prompt_messages",
    "template_clock",
    "version",
)


def unknown_key_error(where: str, key: str, known: Sequence[str], what: str, path: str = "") -> RecordError:
    """The error for a key ``what`` does not have: names the key (under ``path``, e.g. ``engine_calls[0].``), the
    nearest known key, and the fix."""
    near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
    hint = f" (did you mean {path + near[0]!r}?)" if near else ""
    return RecordError(
        f"{where}: unknown key {path + str(key)!r}{hint} in {what}; its keys are {', '.join(known)}. Rename or "
        "remove it (an unknown key is refused, not ignored: a misspelled key would silently replay something else)"
    )


def check_version(where: str, version: Any) -> int:
    """A line's ``version`` (1 when absent: files from before it was written). Raises RecordError for one that is not
    a positive integer, and for one newer than this verl_ext reads, with the fix."""
    if version is None:
        return 1
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise RecordError(f"{where}: 'version' must be a positive integer, got {json_type(version)} ({version!r})")
    if version > SCHEMA_VERSION:
        raise RecordError(
            f"{where}: record schema version {version} is newer than this verl_ext reads (up to {SCHEMA_VERSION}); "
            "upgrade verl_ext to read it"
        )
    return version


# One line is one record held in memory at once; a longer line is refused rather than read whole.
MAX_LINE_BYTES = 256 * 1024 * 1024


def read_json_lines(
    path: str | os.PathLike[str], what: str, hint: str = "", max_line_bytes: int = MAX_LINE_BYTES
) -> Iterator[tuple[int, Any]]:
    """(line number, parsed JSON) for each non-blank line of a JSONL file, one line in memory at a time. Every
    error names the file and line and says what to do: a missing file or a folder, bytes that are not UTF-8, a
    line that is not JSON (or a last line cut off mid-record), a line over ``max_line_bytes``."""
    file = Path(path)
    if file.is_dir():
        raise IsAFolderError(f"{what} {str(path)!r} is a folder; pass the JSONL file inside it")
    if not file.is_file():
        raise MissingFileError(f"{what} {str(path)!r} does not exist")
    with file.open("rb") as fh:
        line_no = 0
        while True:
            raw = fh.readline(max_line_bytes + 1)
            if not raw:
                return
            line_no += 1
            if len(raw) > max_line_bytes:
                raise RecordError(
                    f"{path}:{line_no}: line is longer than {max_line_bytes} bytes; a record that large is not read "
                    "into memory (split the rollout, or check that the file is JSONL: one record per line)"
                )
            if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a UTF-8 byte-order mark some editors write
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RecordError(
                    f"{path}:{line_no}: not UTF-8 (byte 0x{raw[exc.start]:02x} at byte {exc.start + 1} of the line); "
                    f"save the {what} as UTF-8 JSON{hint}"
                ) from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                ends_early = exc.msg.startswith("Unterminated") or exc.pos >= len(line.rstrip()) - 1
                if not raw.endswith(b"\n") and line.lstrip().startswith(("{", "[")) and ends_early:
                    raise RecordError(
                        f"{path}:{line_no}: the last line is cut off mid-record ({exc.msg}); the file was truncated "
                        "or is still being written: remove the partial line or wait for the writer to finish"
                    ) from None
                raise RecordError(f"{path}:{line_no}: not valid JSON ({exc.msg} at column {exc.colno}){hint}") from None
            except RecursionError:
                raise RecordError(f"{path}:{line_no}: JSON nested too deeply to read{hint}") from None
            yield line_no, obj


@dataclass(frozen=True)
class Unparsed:
    """An engine call's output that no message holds: ids, logprobs (None: none recorded) and finish reason."""

    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    finish: FinishReason | str


@dataclass(frozen=True)
class ReplayRecord:
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] | None = None
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)
    sampled: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    logprobs: Mapping[int, tuple[float, ...]] = field(default_factory=dict)
    finish: Mapping[int, FinishReason | str] = field(default_factory=dict)  # str: SGLang's "NaN happened"
    prompt_messages: int | None = None  # messages in the first prompt; default: up to the first assistant message
    template_clock: str | None = None  # the time strftime_now read in the rollout (ISO 8601); None: the wall clock
    # The engine call a rollout ended on whose output never became a message (invalid output: the loop kept it up to
    # the first problem and stopped). Not a key of the format: a check's record holds it in ``engine_calls``.
    unparsed: Unparsed | None = None

    # long: one type check per field, in the order the format documents them; split, the format would scatter
    @classmethod
    def from_json(cls, obj: Any, where: str = "record", unparsed: Unparsed | None = None) -> ReplayRecord:
        """Every field checked for its type; an error names the field (and message index) and the fix. With
        ``unparsed`` (a check's record whose last engine call never became a message), the prompt may be every
        message (``prompt_messages`` up to their count)."""
        if not isinstance(obj, Mapping):
            raise RecordError(f"{where}: expected a JSON object with a 'messages' list, got {json_type(obj)}")
        for key in obj:
            if key not in REPLAY_KEYS:
                raise unknown_key_error(where, key, REPLAY_KEYS, "a replay record")
        check_version(where, obj.get("version"))
        messages = obj.get("messages")
        if not isinstance(messages, list) or not messages:
            got = "an empty list" if messages == [] else json_type(messages)
            raise RecordError(f"{where}: 'messages' must be a non-empty list of OpenAI-format messages, got {got}")
        problem = first_message_problem(messages)
        if problem:
            raise RecordError(f"{where}: {problem}")
        tools = obj.get("tools")
        if tools is not None:
            if not isinstance(tools, list):
                raise RecordError(f"{where}: 'tools' must be a list of tool schemas (objects), got {json_type(tools)}")
            for k, tool in enumerate(tools):
                if not isinstance(tool, Mapping):
                    raise RecordError(f"{where}: 'tools'[{k}] must be a tool schema object, got {json_type(tool)}")
        kwargs = obj.get("chat_template_kwargs")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise RecordError(
                f"{where}: 'chat_template_kwargs' must be an object such as {{\"enable_thinking\": false}}, "
                f"got {json_type(kwargs)}"
            )

        def by_index(name: str, convert: Any) -> dict[int, Any]:
            raw = obj.get(name)
            if raw is None:
                return {}
            if not isinstance(raw, Mapping):
                raise RecordError(
                    f"{where}: '{name}' must be an object mapping assistant message indices (strings such as "
                    f'"1") to values, got {json_type(raw)}'
                )
            out: dict[int, Any] = {}
            for key, value in raw.items():
                if not isinstance(key, str) or not key.isascii() or not key.isdigit():
                    raise RecordError(f"{where}: '{name}' key {key!r} is not a message index (write it as \"1\")")
                index = int(key)
                if index >= len(messages) or messages[index].get("role") != "assistant":
                    raise RecordError(f"{where}: '{name}' key {key!r} does not point at an assistant message")
                try:
                    out[index] = convert(value)
                except (TypeError, ValueError) as exc:
                    raise RecordError(f"{where}: '{name}'[{key!r}] is invalid: {exc}") from None
            return out

        sampled = by_index("sampled", _token_ids)
        logprobs = by_index("logprobs", _logprobs)
        for index, values in logprobs.items():
            if index not in sampled or len(values) != len(sampled[index]):
                have = f"{len(sampled[index])} ids" if index in sampled else "no ids"
                raise RecordError(
                    f"{where}: 'logprobs'[{str(index)!r}] has {len(values)} values but 'sampled' has {have} there; "
                    "give one logprob per sampled id"
                )
        finish = by_index("finish", parse_finish)
        prompt_messages = obj.get("prompt_messages")
        most = len(messages) if unparsed is not None else len(messages) - 1
        if prompt_messages is not None and (
            isinstance(prompt_messages, bool) or not isinstance(prompt_messages, int) or not 0 < prompt_messages <= most
        ):
            raise RecordError(
                f"{where}: 'prompt_messages' must be an integer between 1 and {most}, got {prompt_messages!r}"
            )
        if (
            prompt_messages is not None
            and prompt_messages < len(messages)
            and messages[prompt_messages].get("role") != "assistant"
        ):
            raise RecordError(f"{where}: 'prompt_messages' must point at the first assistant message the rollout made")
        clock = obj.get("template_clock")
        if clock is not None:
            try:
                if not isinstance(clock, str):
                    raise TemplateError(json_type(clock))
                parse_clock(clock)
            except TemplateError:
                raise RecordError(
                    f"{where}: 'template_clock' must be an ISO 8601 time such as \"2026-11-26T23:59:59\" (the time "
                    f"the template's strftime_now read), got {clock!r}"
                ) from None
        return cls(
            tuple(dict(m) for m in messages),
            tuple(dict(t) for t in tools) if tools else None,
            dict(kwargs or {}),
            sampled,
            logprobs,
            finish,
            prompt_messages,
            clock,
            unparsed,
        )


def _token_ids(value: Any) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise TypeError(f"expected a list of token ids (integers), got {json_type(value)}")
    for k, i in enumerate(value):
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"item {k} is {json_type(i)} ({i!r}), not an integer token id")
    return tuple(value)


def _logprobs(value: Any) -> tuple[float, ...]:
    """Numbers, or the strings record files write for floats that are not finite (``NON_FINITE_JSON``)."""
    if not isinstance(value, list):
        raise TypeError(f"expected a list of numbers (one logprob per sampled id), got {json_type(value)}")
    for k, x in enumerate(value):
        if isinstance(x, str) and x in NON_FINITE_JSON:
            continue
        if isinstance(x, bool) or not isinstance(x, int | float):
            raise TypeError(f'item {k} is {json_type(x)} ({x!r}), not a number (or "NaN", "Infinity", "-Infinity")')
    return tuple(NON_FINITE_JSON[x] if isinstance(x, str) else float(x) for x in value)


def parse_finish(value: Any) -> FinishReason | str:
    """``"stop"``, ``"length"``, or SGLang's finish_reason object ({"type": ..., "matched": ...}); a NaN stop is kept as
    SGLang's "NaN happened" so the trajectory rejects the substituted stop id."""
    if isinstance(value, Mapping):
        if reports_nan(value):
            return NAN_HAPPENED
        value = value.get("type")
    if value == NAN_HAPPENED:
        return NAN_HAPPENED
    if value not in ("stop", "length"):
        raise ValueError(
            f'{value!r} is not a finish reason: write "stop" or "length" (or SGLang\'s finish_reason object)'
        )
    return FinishReason(value)


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
    """Build the trajectory a rollout would have built for ``record``. The record's ``chat_template_kwargs`` add to
    (and override) the renderer's own: a template that needs a variable (``--template-kwargs``) keeps it."""
    renderer = renderer.with_template_kwargs({**renderer.template_kwargs, **record.chat_template_kwargs})
    if record.template_clock is not None:  # the time the rollout's template read (its prompt's date), not now
        renderer = renderer.with_clock(record.template_clock)
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
    if record.unparsed is not None:
        u = record.unparsed
        t.add_sampled(u.output_ids, u.logprobs, u.finish)
    t.finish()
    return t
