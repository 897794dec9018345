"""Does an assistant message hold what the engine sampled? The verdict on one turn's sampled segment.

Inside a sampled segment the stream is the engine's tokens by construction, so a divergence from the render is
either the template writing the same message its own way (whitespace it strips, thinking it drops or reformats,
tool-call JSON it re-serializes or moves after the content, structure text it writes around content) or a message
that does not hold what was sampled (a tool call run with other arguments than the model wrote). Which one is
decided on text, by what templates can and cannot do to a message:

- structure (control-token text: ``<think>``, ``<tool_call>``, ``<|channel|>``) and whitespace are the template's;
- every JSON object the render holds must be one the engine sampled (keys the template adds from the message's
  call metadata, ``id`` and ``type``, aside; arguments given as a JSON string equal to the object they encode);
- every other run of text the render holds must be sampled text, or text the template writes around any
  assistant content (its frame, e.g. GPT-OSS's ``final`` channel name).

Sampled text the render lacks is allowed (templates drop reasoning and odd text); a tool call the render holds and
the engine did not sample is not.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

# Keys a template writes into a rendered tool call from the message's own call record, never sampled.
_CALL_METADATA = frozenset({"id", "type", "call_id", "tool_call_id"})
# Where a call's arguments sit in a call object as models write it.
_ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass(frozen=True)
class TurnVerdict:
    """Whether a turn's message holds what was sampled; ``detail`` names the first thing it does not hold."""

    holds: bool
    detail: str = ""


@dataclass(frozen=True)
class _Reading:
    """A text read as the verdict compares it: its JSON objects (canonical) and its other text runs (squashed)."""

    objects: tuple[Any, ...]
    runs: tuple[str, ...]

    @property
    def text(self) -> str:
        return "".join(self.runs)


def message_holds_sampled(
    sampled: str,
    rendered: str,
    structure: re.Pattern[str] | None,
    frame: Collection[str] = (),
    normalize: Callable[[str], str] = lambda s: s,
) -> TurnVerdict:
    """The verdict for one turn: ``sampled`` is the text of the engine's output, ``rendered`` the text the template
    writes for the turn's message; ``structure`` matches control-token text; ``frame`` holds the (squashed) text
    runs the template writes around any assistant content; ``normalize`` is the tokenizer's normalizer."""
    ours = _read(normalize(sampled), structure)
    theirs = _read(normalize(rendered), structure)
    unmatched = list(ours.objects)
    for obj in theirs.objects:
        hit = next((k for k, mine in enumerate(unmatched) if _same_call(obj, mine)), None)
        if hit is None:
            shown = json.dumps(obj, ensure_ascii=False, sort_keys=True)
            return TurnVerdict(False, f"the message holds JSON {shown[:160]} that the engine did not sample")
        del unmatched[hit]
    text = ours.text
    for run in theirs.runs:
        if run not in text and run not in frame and not _frame_only(run, frame):
            return TurnVerdict(False, f"the message holds text {run[:80]!r} that the engine did not sample")
    return TurnVerdict(True)


def frame_runs(text_before: str, text_after: str, structure: re.Pattern[str] | None) -> frozenset[str]:
    """The squashed text runs of what a template writes before and after an assistant message's content."""
    return frozenset(r for part in (text_before, text_after) for r in _read(part, structure).runs)


def _frame_only(run: str, frame: Collection[str]) -> bool:
    """``run`` is made of frame runs only (a frame text merged with the next one where no structure parts them)."""
    rest = run
    for piece in sorted(frame, key=len, reverse=True):
        rest = rest.replace(piece, "")
    return not rest


def _read(text: str, structure: re.Pattern[str] | None) -> _Reading:
    objects: list[Any] = []
    runs: list[str] = []
    pieces = structure.split(text) if structure is not None else [text]
    for piece in pieces:
        for kind, value in json_and_text(piece):
            if kind == "json":
                objects.append(value)
            else:
                squashed = "".join(value.split())
                if squashed:
                    runs.append(squashed)
    return _Reading(tuple(objects), tuple(runs))


def json_and_text(piece: str) -> Iterator[tuple[str, Any]]:
    """The piece as JSON objects and the text between them, in order."""
    decoder = json.JSONDecoder()
    start = 0
    i = piece.find("{")
    while i != -1:
        try:
            obj, end = decoder.raw_decode(piece, i)
        except json.JSONDecodeError:
            i = piece.find("{", i + 1)
            continue
        if not isinstance(obj, dict):
            i = piece.find("{", i + 1)
            continue
        yield "text", piece[start:i]
        yield "json", obj
        start = end
        i = piece.find("{", end)
    yield "text", piece[start:]


def _same_call(rendered: Any, sampled: Any) -> bool:
    """The rendered object is the sampled one: equal once call metadata is set aside and JSON-string arguments are
    read; or one is the other's arguments (a template that renders the arguments alone, or the whole call)."""
    a, b = _canonical(rendered), _canonical(sampled)
    if a == b:
        return True
    pairs = ((a, b), (b, a))
    return any(isinstance(x, dict) and _canonical(x.get(k), False) == y for x, y in pairs for k in _ARGUMENT_KEYS)


def _canonical(value: Any, top: bool = True) -> Any:
    """``value`` with the call metadata of a top-level object set aside and its JSON-string arguments read."""
    if isinstance(value, dict):
        out = {k: _canonical(v, False) for k, v in value.items() if not (top and k in _CALL_METADATA)}
        for key in _ARGUMENT_KEYS if top else ():
            for _ in range(2):  # arguments a template encoded once more (``tojson`` of a JSON string)
                if isinstance(out.get(key), str):
                    with contextlib.suppress(json.JSONDecodeError, TypeError):
                        out[key] = _canonical(json.loads(out[key]), False)
        return out
    if isinstance(value, list):
        return [_canonical(v, False) for v in value]
    return value
