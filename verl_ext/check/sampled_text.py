"""Does an assistant message hold what the engine sampled? The verdict on one turn's sampled segment.

Inside a sampled segment the stream is the engine's tokens by construction, so a divergence from the render is
either the template writing the same message its own way (whitespace it strips, thinking it drops or reformats,
tool-call JSON it re-serializes or moves after the content, structure text it writes around content) or a message
that does not hold what was sampled (a tool call run with other arguments than the model wrote). Which one is
decided on text, by what templates can and cannot do to a message:

- structure (control-token text: ``<think>``, ``<tool_call>``, ``<|channel|>``) and whitespace are the template's;
- every JSON object the render holds must be one the engine sampled (keys the template adds from the message's
  call metadata, ``id`` and ``type``, aside; arguments given as a JSON string equal to the object they encode);
- every other run of text the render holds must be sampled text (or pieces of it in order: the content a parser
  leaves once it took a tool-call block out), or text the template writes around any assistant content (its frame,
  e.g. GPT-OSS's ``final`` channel name), or the template's text for this message with sampled text in its slots
  (``message_shape``: a tool call the template writes in its own format, whatever format the model sampled).

Sampled text the render lacks is allowed (templates drop reasoning and odd text); a tool call the render holds and
the engine did not sample is not.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

# Keys a template writes into a rendered tool call from the message's own call record, never sampled.
_CALL_METADATA = frozenset({"id", "type", "call_id", "tool_call_id"})
# Ways to place a message's template text in one rendered run tried at most (a run that needs more is not excused).
_FILL_BUDGET = 256
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
    spaced: tuple[str, ...] = ()  # each run with its whitespace as one space (words as written)

    @property
    def text(self) -> str:
        return "".join(self.runs)


def message_holds_sampled(
    sampled: str,
    rendered: str,
    structure: re.Pattern[str] | None,
    frame: Collection[str] = (),
    normalize: Callable[[str], str] = lambda s: s,
    shapes: Collection[Sequence[str]] = (),
    reasoning_closes: Collection[str] = (),
) -> TurnVerdict:
    """The verdict for one turn: ``sampled`` is the text of the engine's output, ``rendered`` the text the template
    writes for the turn's message; ``structure`` matches control-token text; ``frame`` holds the (squashed) text
    runs the template writes around any assistant content; ``normalize`` is the tokenizer's normalizer; ``shapes``
    are the runs the template writes for this message (``message_shape``), each as its text between slots;
    ``reasoning_closes`` are the texts the template ends reasoning with: where the engine wrote one and the render
    holds none (the template dropped the reasoning), the render's text must be sampled after the last one (the
    answer), never text of the dropped reasoning."""
    text = normalize(sampled)
    ours = _read(text, structure)
    rendered = normalize(rendered)
    theirs = _read(rendered, structure)
    if not any(c in rendered for c in reasoning_closes):
        ends = [text.rfind(c) + len(c) for c in reasoning_closes if c in text]
        if ends:
            answer = _read(text[max(ends) :], structure)
            ours = _Reading(ours.objects, answer.runs)
            text = text[max(ends) :]
    missing = _unheld_objects(ours.objects, theirs.objects)
    if missing:
        return missing
    # Sampled text as a parser may have cut it: the runs outside JSON objects, and all of it squashed (a call's name
    # and argument values are text inside the JSON the model wrote). A parser takes out one block per call it read.
    whole = "".join(text.split())
    pieces = 2 + len(ours.objects)

    def is_sampled(run: str) -> bool:
        return run in ours.text or run in whole or _pieced(run, whole, pieces)

    # Words as the engine wrote them: a template strips or adds whitespace around content, never inside it, so a
    # run whose words the engine wrote apart or together ("/ tmp" for "/tmp") is not what was sampled.
    words = " ".join(text.split())
    for run, spaced in zip(theirs.runs, theirs.spaced, strict=True):
        if run in frame or _frame_only(run, frame):
            continue
        if is_sampled(run):
            if " " not in spaced or spaced in words or _pieced(spaced, words, pieces + 2):
                continue
            return TurnVerdict(False, f"the message holds {spaced[:80]!r}, spaced otherwise than the engine wrote it")
        if any(_fills(parts, run, is_sampled) for parts in shapes):
            continue
        return TurnVerdict(False, f"the message holds text {run[:80]!r} that the engine did not sample")
    return TurnVerdict(True)


def _is_call(obj: Any) -> bool:
    """A call object: a name and its arguments (``_canonical`` puts ``parameters`` under ``arguments``)."""
    return isinstance(obj, dict) and isinstance(obj.get("name"), str) and "arguments" in obj


def _unheld_objects(ours: Sequence[Any], theirs: Sequence[Any]) -> TurnVerdict | None:
    """The first rendered JSON object not sampled (calls in the order sampled: each after the call the previous one
    was, so swapped calls are not held); None where every object is held. A sampled call the message lacks is not
    named here: without per-call markers the text cannot tell a call the loop dropped from one the parser could not
    read (``tool_call_compare`` tells them apart where the template writes such markers)."""
    unmatched = list(ours)
    last_call = -1
    for obj in theirs:
        call = _is_call(_canonical(obj))
        hit = next(
            (k for k, mine in enumerate(unmatched) if (not call or k > last_call) and _same_call(obj, mine)), None
        )
        if hit is None:
            shown = json.dumps(obj, ensure_ascii=False, sort_keys=True)
            where = " there (calls in another order)" if call else ""
            return TurnVerdict(False, f"the message holds JSON {shown[:160]} that the engine did not sample{where}")
        if call:
            last_call = hit
        unmatched[hit] = _HELD
    return None


_HELD = object()  # a sampled object matched to a rendered one


def text_runs(text: str, structure: re.Pattern[str] | None) -> tuple[str, ...]:
    """The squashed text runs of ``text`` outside control-token text and JSON objects, in order."""
    return _read(text, structure).runs


def _fills(parts: Sequence[str], run: str, is_sampled: Callable[[str], bool]) -> bool:
    """``run`` is a stretch of the template's text for the message (``parts``: its text between slots) with sampled
    text in the slots: one or more of the parts in order, each gap between them sampled, and sampled text (the end or
    start of a slot's value) before the first and after the last. A stretch, because a slot's value that holds
    control-token text or JSON splits the run there."""
    literals = [p for p in parts if p]
    budget = [_FILL_BUDGET]

    def rest(k: int, at: int) -> bool:  # literals[k:] may follow from ``at``, or the run may end in a slot's value
        tail = run[at:]
        if not tail or is_sampled(tail):
            return True
        if k == len(literals):
            return False
        found = run.find(literals[k], at)
        while found != -1 and budget[0] > 0:
            budget[0] -= 1
            gap = run[at:found]
            if (not gap or is_sampled(gap)) and rest(k + 1, found + len(literals[k])):
                return True
            found = run.find(literals[k], found + 1)
        return False

    for k, literal in enumerate(literals):
        found = run.find(literal)
        while found != -1 and budget[0] > 0:
            budget[0] -= 1
            head = run[:found]
            if (not head or is_sampled(head)) and rest(k + 1, found + len(literal)):
                return True
            found = run.find(literal, found + 1)
    return False


def _pieced(run: str, text: str, most: int) -> bool:
    """``run`` is at most ``most`` pieces of ``text`` in their order (text a parser took blocks out of): each the
    longest prefix of what is left that occurs after the previous piece."""
    at = 0
    for _ in range(most):
        if not run:
            return True
        # The longest prefix found after ``at`` (a shorter prefix of one that is found is found too: bisect).
        low, high = 0, len(run)
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if text.find(run[:mid], at) != -1 else (low, mid - 1)
        size = low
        if not size:
            return False
        at = text.find(run[:size], at) + size
        run = run[size:]
    return not run


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
    spaced: list[str] = []
    # JSON objects first, over the whole text: control-token text inside a JSON string is text, not structure
    for kind, value in json_and_text(text):
        if kind == "json":
            objects.append(value)
            continue
        for piece in structure.split(value) if structure is not None else [value]:
            words = piece.split()
            if words:
                runs.append("".join(words))
                spaced.append(" ".join(words))
    return _Reading(tuple(objects), tuple(runs), tuple(spaced))


_DECODER = json.JSONDecoder()  # stateless; building one compiles its scanner (tens of microseconds, per turn's piece)


def json_and_text(piece: str) -> Iterator[tuple[str, Any]]:
    """The piece as JSON objects and the text between them, in order."""
    decoder = _DECODER
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
    """``value`` with the call metadata of a top-level object set aside, its JSON-string arguments read, and its
    arguments under one key (which of ``arguments`` / ``parameters`` a call object uses is the writer's convention:
    Llama's templates write ``parameters`` for the ``arguments`` a model wrote)."""
    if isinstance(value, dict):
        out = {k: _canonical(v, False) for k, v in value.items() if not (top and k in _CALL_METADATA)}
        for key in _ARGUMENT_KEYS if top else ():
            for _ in range(2):  # arguments a template encoded once more (``tojson`` of a JSON string)
                if isinstance(out.get(key), str):
                    with contextlib.suppress(json.JSONDecodeError, TypeError):
                        out[key] = _canonical(json.loads(out[key]), False)
        present = [k for k in _ARGUMENT_KEYS if k in out] if top else []
        if len(present) == 1:
            out[_ARGUMENT_KEYS[0]] = out.pop(present[0])
        return out
    if isinstance(value, list):
        return [_canonical(v, False) for v in value]
    return value
