"""What the check compares: the engine's record of a rollout and the trainer's view of it.

Both are plain ids, independent of how the rollout built its tokens, so the same check audits
verl_ext's own agent loop and any other (verl's stock ``tool_agent`` included).
"""

from __future__ import annotations

import operator
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, overload

from verl_ext.core.errors import TrajectoryError
from verl_ext.core.images import image_digest
from verl_ext.core.prompt_ids import PromptIds
from verl_ext.core.trajectory import TokenTrajectory


def _as_ints(values: Sequence[Any]) -> tuple[int, ...]:
    """``values`` as a tuple of ints (``int(v)`` each: numpy ints, bools and the like converted). An agent loop
    builds an ``EngineCall`` per engine call with the whole prompt, so this runs at C speed: the common input (ints
    already) is copied and its types checked without a Python-level loop; anything else is converted with ``map``. A
    trajectory's ``PromptIds`` holds plain ints by contract (``check_invariants`` verifies it): copied, not scanned,
    so the agent loop's per-turn record of the prompt costs a copy instead of a type scan of the whole stream."""
    if isinstance(values, PromptIds):
        return tuple(values)
    out = tuple(values)
    return out if _only(out, int) else tuple(map(int, out))


def _as_floats(values: Sequence[Any]) -> tuple[float, ...]:
    """``values`` as a tuple of floats (``float(v)`` each), at C speed as ``_as_ints``."""
    out = tuple(values)
    return out if _only(out, float) else tuple(map(float, out))


def _only(values: tuple[Any, ...], kind: type) -> bool:
    """Whether every value's type is exactly ``kind`` (not a subclass: a bool is converted to its int)."""
    types = set(map(type, values))
    return not types or types == {kind}


def _packed(values: Sequence[Any]) -> Sequence[int]:
    """``values`` as ints packed 4 bytes each (``array("i")``; 8 bytes where an id needs them, a tuple past 64 bits):
    the engine-call records keep millions of ids on a long rollout, and a tuple of ints costs 8 bytes a slot plus
    each int object."""
    try:
        return array("i", values)
    except OverflowError:
        pass
    except TypeError:  # floats, numpy floats: converted with int() as ``_as_ints`` does
        return _packed(_as_ints(values))
    try:
        return array("q", values)
    except OverflowError:  # an id no tokenizer has: kept as it is, the check reports it
        return _as_ints(values)


class EngineCall:
    """One generate call as the engine saw it: what it received and what it returned.

    The prompt is kept packed, and a call recorded after another (``EngineCalls.record``) keeps only what its prompt
    adds to that call's prompt + output: ``prompt_ids`` rebuilds the whole prompt on demand (O(prompt): read it once,
    not per call; the engine view reads the chain in one pass). A rollout of n turns so holds its prompts in O(stream)
    memory instead of O(n x stream). Equal calls (same prompt, output, logprobs, finish reason and images) compare
    equal however they were built.

    The images the call was given (a vision-language model's ``image_data``) are kept as digests, the same way: a
    call after another keeps how many of that call's images it starts with (``images_kept``) and the digests of the
    rest (``images_added``), so a rollout whose every call repeats the images so far plus new ones holds each
    digest once. ``image_digests`` rebuilds the whole list; None: the call's images were not recorded (a text loop,
    or a loop from before they were).
    """

    __slots__ = (
        "_after",
        "_images_added",
        "_images_kept",
        "_shared",
        "_tail",
        "finish_reason",
        "logprobs",
        "output_ids",
        "prompt_length",
    )

    def __init__(
        self,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        logprobs: Sequence[float] | None = None,
        finish_reason: str = "stop",
        *,
        after: EngineCall | None = None,
        shared: int = 0,
        images_kept: int = 0,
        images_added: tuple[str, ...] | None = None,
    ) -> None:
        """A call whose prompt is ``prompt_ids``; or, with ``after``, the first ``shared`` ids of ``after``'s prompt +
        output followed by ``prompt_ids`` (``EngineCalls`` builds these). Ids and logprobs are kept as given (tuples
        of ints and floats): use ``EngineCall.of`` to convert. The call was given the first ``images_kept`` images of
        ``after`` (0 without it) then the images whose digests are ``images_added`` (None: not recorded)."""
        if after is not None and not 0 <= shared <= after.output_end:
            raise ValueError(f"an engine call sharing {shared} ids of a call of {after.output_end}")
        self._after = after if shared else None
        self._shared = shared if after is not None else 0
        if images_kept and (images_added is None or self._after is None or images_kept > self._after.image_count):
            raise ValueError(f"an engine call keeping {images_kept} images of a call that has fewer (or none)")
        self._images_kept = images_kept
        self._images_added = images_added
        self._tail = _packed(prompt_ids)
        self.prompt_length: int = self._shared + len(self._tail)
        self.output_ids: tuple[int, ...] = tuple(output_ids)  # stop token included when the engine stopped on one
        # One per output id; None when the engine did not return them.
        self.logprobs: tuple[float, ...] | None = None if logprobs is None else tuple(logprobs)
        self.finish_reason: str = finish_reason  # "stop" | "length" | anything else the engine reports

    @classmethod
    def of(
        cls,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        logprobs: Sequence[float] | None = None,
        finish_reason: str = "stop",
        image_digests: Sequence[str] | None = None,
    ) -> EngineCall:
        """From any sequences (lists, arrays): ids become ints, logprobs floats, the finish reason its string;
        ``image_digests``: the digests of the images the call was given, in order (None: not recorded). The whole
        prompt is copied (packed): a loop records its calls with ``EngineCalls.record`` instead."""
        return cls(
            prompt_ids,
            _as_ints(output_ids),
            None if logprobs is None else _as_floats(logprobs),
            str(finish_reason),
            images_added=None if image_digests is None else tuple(map(str, image_digests)),
        )

    @property
    def after(self) -> EngineCall | None:
        """The call whose prompt + output this call's prompt starts with (its first ``shared`` ids), or None."""
        return self._after

    @property
    def shared(self) -> int:
        """How many of the prompt's first ids are ``after``'s prompt + output (0 without ``after``)."""
        return self._shared

    @property
    def tail(self) -> Sequence[int]:
        """The prompt's ids after the ``shared`` ones (packed; read-only by contract)."""
        return self._tail

    @property
    def images_kept(self) -> int:
        """How many of ``after``'s images this call was given first (0 without ``after``)."""
        return self._images_kept

    @property
    def images_added(self) -> tuple[str, ...] | None:
        """The digests of the images this call was given after the kept ones; None: its images were not recorded."""
        return self._images_added

    @property
    def image_count(self) -> int:
        """How many images the call was given (0 when they were not recorded)."""
        return self._images_kept + len(self._images_added or ())

    @property
    def image_digests(self) -> tuple[str, ...] | None:
        """The digests of every image the call was given, in the order it was given them (rebuilt from the chain of
        calls: O(chain) per read; ``engine_call_images`` reads a log's in one pass); None: not recorded."""
        if self._images_added is None:
            return None
        parts = [self._images_added]
        need, call = self._images_kept, self._after  # the first ``need`` images of ``call`` come before
        while need and call is not None and call._images_added is not None:  # the constructor keeps the chain whole
            if need > call._images_kept:
                parts.append(call._images_added[: need - call._images_kept])
                need = call._images_kept
            call = call._after
        return tuple(d for part in reversed(parts) for d in part)

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        """The whole prompt, rebuilt from the chain of calls (O(prompt) per read)."""
        return tuple(self.stream()[: self.prompt_length])

    def stream(self) -> array[int] | list[int]:
        """The prompt + output, as a new packed array (a list when an id does not fit 32 bits): one pass over the
        chain of calls this one extends."""
        chain: list[EngineCall] = []
        call: EngineCall | None = self
        while call is not None:
            chain.append(call)
            call = call._after
        chain.reverse()
        out = array("i")
        try:
            for c in chain:
                del out[c._shared :]
                out.extend(c._tail)  # type: ignore[arg-type]  # TypeError when not an array("i"): see below
                out.extend(c.output_ids)
        except (OverflowError, TypeError):  # an id past 32 bits somewhere in the chain
            ids: list[int] = []
            for c in chain:
                del ids[c._shared :]
                ids += c._tail
                ids += c.output_ids
            return ids
        return out

    @property
    def output_start(self) -> int:
        """The stream position of the first output id (the prompt's length)."""
        return self.prompt_length

    @property
    def output_end(self) -> int:
        """The stream position just after the last output id."""
        return self.prompt_length + len(self.output_ids)

    def replace(
        self,
        *,
        output_ids: Sequence[int] | None = None,
        logprobs: Sequence[float] | None | Literal[False] = False,
        finish_reason: str | None = None,
        image_digests: Sequence[str] | None | Literal[False] = False,
    ) -> EngineCall:
        """This call with another output, logprobs (None: none), finish reason or images (their digests; None: not
        recorded); the same prompt, kept as it is (``dataclasses.replace`` for an ``EngineCall``, which is no
        dataclass: it keeps its prompt as a chain)."""
        kept, added = self._images_kept, self._images_added
        if image_digests is not False:
            kept, added = 0, None if image_digests is None else tuple(image_digests)
        return EngineCall(
            self._tail,
            self.output_ids if output_ids is None else tuple(output_ids),
            self.logprobs if logprobs is False else (None if logprobs is None else tuple(logprobs)),
            self.finish_reason if finish_reason is None else finish_reason,
            after=self._after,
            shared=self._shared,
            images_kept=kept,
            images_added=added,
        )

    def _key(self) -> tuple[Any, ...]:
        return (self.prompt_ids, self.output_ids, self.logprobs, self.finish_reason, self.image_digests)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, EngineCall):
            return NotImplemented
        return self is other or (
            self.prompt_length == other.prompt_length
            and self.output_ids == other.output_ids
            and self.logprobs == other.logprobs
            and self.finish_reason == other.finish_reason
            and self.image_digests == other.image_digests
            and self.prompt_ids == other.prompt_ids
        )

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        images = "" if self._images_added is None else f", images=<{self.image_count}>"
        return (
            f"EngineCall(prompt_ids=<{self.prompt_length} ids>, output_ids={self.output_ids!r}, "
            f"logprobs={self.logprobs!r}, finish_reason={self.finish_reason!r}{images})"
        )


class EngineCalls(Sequence[EngineCall]):
    """One rollout's engine calls, recorded as they happen: ``calls.record(prompt_ids, output_ids, logprobs,
    finish_reason, images=...)`` after each generate call. A sequence of ``EngineCall`` (what the check and the record
    read).

    Each call keeps only what its prompt adds to the previous call's prompt + output, so recording costs O(new ids)
    per turn and the log holds O(stream) ids however many turns. The prompt's earlier ids are read once: when the
    prompt is a ``PromptIds`` view of the same append-only stream as the previous call's (the token core's
    trajectory: its stream is never changed in place, ``check_invariants`` proves it), only its new ids are copied;
    any other prompt (a stock loop's list) is compared with the previous call's prompt + output at C speed, and
    where it departs from them (a re-tokenized history) the call keeps the rest. The engine view then compares
    every call, at every position, with the final stream, in one pass over the chain.

    ``images`` (a vision-language loop: the very list passed to the engine as ``image_data``) is kept the same way,
    as digests: an image object the previous call was given at the same place is not digested again (the loops
    pass the trajectory's image objects, never changed in place), so a call that repeats the previous call's images
    plus new ones digests and keeps only the new ones.
    """

    __slots__ = ("_calls", "_last_digests", "_last_full", "_last_images", "_last_prompt", "_pending")

    def __init__(self, calls: Iterable[EngineCall] = ()) -> None:
        self._calls: list[EngineCall] = []
        self._last_prompt: PromptIds | None = None  # the last call's prompt, when it was a trajectory's view
        # The last call's prompt + output, kept up to date while prompts come as plain sequences (a stock loop's).
        self._last_full: array[int] | None = None
        # The last call's images as given (the objects, for the identity test) and their digests, when built here.
        self._last_images: tuple[Any, ...] | None = None
        self._last_digests: tuple[str, ...] | None = None
        self._pending: _Pending | None = None  # from next_call
        for call in calls:
            self.append(call)

    def record(
        self,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        logprobs: Sequence[float] | None = None,
        finish_reason: str = "stop",
        images: Sequence[Any] | None = None,
    ) -> EngineCall:
        """Record one generate call (``EngineCall.of``'s conversions) and return it."""
        call = self.next_call(prompt_ids, output_ids, logprobs, finish_reason, images)
        self.append(call)
        return call

    def next_call(
        self,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        logprobs: Sequence[float] | None = None,
        finish_reason: str = "stop",
        images: Sequence[Any] | None = None,
    ) -> EngineCall:
        """The call ``record`` would record, without recording it: ``append`` it once the turn is kept (the
        gateway's branch does). ``images``: the images the call was given, in the order given (None: not
        recorded; ``()``: none)."""
        output = _as_ints(output_ids)
        lps = None if logprobs is None else _as_floats(logprobs)
        previous = self._calls[-1] if self._calls else None
        view = prompt_ids if isinstance(prompt_ids, PromptIds) else None
        full: array[int] | None = None
        if previous is None:
            tail, shared = prompt_ids, 0
        elif view is not None and self._last_prompt is not None and view.extends(self._last_prompt):
            # The same append-only stream, at least as long: its first ``len(last)`` ids are the previous prompt;
            # only the ids after it are read (and compared with the previous output).
            n = len(self._last_prompt)
            shared = n + _common_length(view[n : n + len(previous.output_ids)], previous.output_ids)
            tail = view[shared:]
        else:
            # ``_last_full`` is grown into this call's prompt + output below: taken, so that a second next_call
            # before an append does not read it changed.
            known, self._last_full = (self._last_full if self._last_full is not None else previous.stream()), None
            shared = _common_length(prompt_ids, known)
            tail = prompt_ids[shared:]
            full = _grown(known, shared, tail, output)
        given = None if images is None else tuple(images)
        digests = None if given is None else self._digests(given)
        kept = 0
        if digests is not None and previous is not None and shared:  # ``after`` is the previous call
            before = self._last_digests if self._last_digests is not None else previous.image_digests
            kept = 0 if before is None else _common_length(before, digests)
        call = EngineCall(
            tail,
            output,
            lps,
            str(finish_reason),
            after=previous,
            shared=shared,
            images_kept=kept,
            images_added=None if digests is None else digests[kept:],
        )
        if previous is None and view is None:
            full = _grown(array("i"), 0, call.tail, output)
        self._pending = _Pending(call, view, full, given, digests)
        return call

    def _digests(self, images: tuple[Any, ...]) -> tuple[str, ...]:
        """The digests of ``images``: those the previous call was given at the same place (the same objects) are
        taken from it, only the others are digested."""
        last, known = self._last_images, self._last_digests
        same = 0
        if last is not None and known is not None:
            n = min(len(last), len(images))
            if all(map(operator.is_, images[:n], last[:n])):  # the common case (the same objects so far), at C speed
                same = n
            else:
                while images[same] is last[same]:
                    same += 1
        return (known[:same] if same and known is not None else ()) + tuple(map(image_digest, images[same:]))

    def append(self, call: EngineCall) -> None:
        """Add a call built elsewhere (by ``next_call``, or another log's: a gateway fork replays its parent's)."""
        pending, self._pending = self._pending, None
        if pending is not None and pending.call is call:
            self._last_prompt, self._last_full = pending.view, pending.full
            self._last_images, self._last_digests = pending.images, pending.digests
        else:
            self._last_prompt = self._last_full = self._last_images = self._last_digests = None
        self._calls.append(call)

    def __len__(self) -> int:
        return len(self._calls)

    @overload
    def __getitem__(self, index: int) -> EngineCall: ...

    @overload
    def __getitem__(self, index: slice) -> list[EngineCall]: ...

    def __getitem__(self, index: int | slice) -> EngineCall | list[EngineCall]:
        return self._calls[index]

    def __iter__(self) -> Iterator[EngineCall]:
        return iter(self._calls)

    def __repr__(self) -> str:
        return f"EngineCalls({len(self._calls)} calls)"


@dataclass(frozen=True)
class _Pending:
    """What ``EngineCalls.next_call`` knew of the call it built, taken over by ``append`` when that call is kept."""

    call: EngineCall
    view: PromptIds | None  # its prompt, when a trajectory's view
    full: array[int] | None  # its prompt + output, when grown here
    images: tuple[Any, ...] | None  # the image objects it was given
    digests: tuple[str, ...] | None  # and their digests


def engine_call_images(calls: Iterable[EngineCall]) -> Iterator[tuple[int, tuple[str, ...] | None]]:
    """Per call, its prompt length and the digests of the images it was given (None: not recorded), in one pass: a
    call that keeps the previous call's images is rebuilt from that call's list, not from its chain."""
    previous: EngineCall | None = None
    before: tuple[str, ...] | None = None
    for call in calls:
        added = call.images_added
        if added is None:
            digests = None
        elif not call.images_kept:
            digests = added
        elif call.after is previous and before is not None:
            digests = before[: call.images_kept] + added
        else:
            digests = call.image_digests
        yield call.prompt_length, digests
        previous, before = call, digests


def _grown(ids: array[int] | list[int], keep: int, *parts: Sequence[int]) -> array[int] | None:
    """``ids[:keep] + parts``, in place when ``ids`` is an ``array("i")``; None when an id does not fit it."""
    if not isinstance(ids, array) or ids.typecode != "i":
        return None
    try:
        del ids[keep:]
        for part in parts:
            ids.extend(part if isinstance(part, array) and part.typecode == "i" else array("i", part))
    except (OverflowError, TypeError):
        return None
    return ids


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of ``a`` and ``b`` (one C-speed comparison when one is a prefix of
    the other, then halving)."""
    n = min(len(a), len(b))
    head_a, head_b = list(a[:n]), list(b[:n])
    if head_a == head_b:
        return n
    lo, hi = 0, n  # head_a[:lo] == head_b[:lo], head_a[:hi] != head_b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if head_a[lo:mid] == head_b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class TrainerSample:
    """One rollout as the trainer receives it: prompt ids, then response ids with their mask and logprobs."""

    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    response_mask: tuple[int, ...]
    response_logprobs: tuple[float, ...] | None = None

    @classmethod
    def of(
        cls,
        prompt_ids: Sequence[int],
        response_ids: Sequence[int],
        response_mask: Sequence[int],
        response_logprobs: Sequence[float] | None = None,
    ) -> TrainerSample:
        """From any sequences (lists, tensors' ``tolist()``): ids and mask become ints, logprobs floats."""
        return cls(
            _as_ints(prompt_ids),
            _as_ints(response_ids),
            _as_ints(response_mask),
            None if response_logprobs is None else _as_floats(response_logprobs),
        )

    @property
    def stream(self) -> tuple[int, ...]:
        """The training stream: prompt ids then response ids."""
        return self.prompt_ids + self.response_ids


def rollout_assistants(
    messages: Sequence[Mapping[str, Any]], n_calls: int, prompt_messages: int | None = None
) -> list[int]:
    """Indices of the assistant messages the rollout produced (message k answers engine call k).

    ``prompt_messages`` is how many messages the first prompt had (chat history or few-shot assistant messages
    in it are not engine output). Without it, when there are more assistant messages than calls, the last
    ``n_calls`` are taken.
    """
    start = prompt_messages or 0
    found = [i for i in range(start, len(messages)) if messages[i].get("role") == "assistant"]
    return found[-n_calls:] if prompt_messages is None and len(found) > n_calls else found


def engine_calls_from_trajectory(t: TokenTrajectory) -> list[EngineCall]:
    """The engine calls a token-core trajectory records, one per turn: the prompt the engine was sent, the ids and
    logprobs it returned, and the turn's finish reason ("stop" for a turn recorded without one)."""
    return [
        EngineCall.of(
            t.input_ids[: turn.prompt_length],
            t.input_ids[turn.sampled_start : turn.sampled_end],
            t.logprobs[turn.sampled_start : turn.sampled_end],
            turn.finish_reason.value if turn.finish_reason else "stop",
        )
        for turn in t.turns
    ]


def trainer_sample_from_trajectory(t: TokenTrajectory, response_length: int | None = None) -> TrainerSample:
    """The trainer's view of a token-core trajectory: the first prompt, then everything after it as the
    response, cut at ``response_length`` when given (as verl cuts it)."""
    if not t.turns:
        raise TrajectoryError("the trajectory has no engine call yet; a trainer sample needs at least one turn")
    p = t.turns[0].prompt_length
    stream = t.input_ids
    end = len(stream) if response_length is None else min(len(stream), p + response_length)
    # The stream is packed ints and the mask is built of 0s and 1s: tuples of them need no type scan (200k ids at
    # the end of a 1,000-turn rollout). The logprobs are the engine's, as it returned them: converted.
    return TrainerSample(
        tuple(stream[:p]),
        tuple(stream[p:end]),
        tuple(t.loss_mask[p:end]),
        _as_floats(t.logprobs[p:end]) if t.has_logprobs else None,
    )
