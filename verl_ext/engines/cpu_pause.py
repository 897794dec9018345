"""Partial rollouts on the CPU engine: verl's abort, pause and resume, taken between two tokens.

verl's async trainers (the v1 trainer's ``colocate_async`` and ``separate_async``, ``fully_async_policy``) call
``abort_all_requests`` on every rollout server before a weight update and ``resume_generation`` after it. As verl's
vLLM server does, the CPU engine then stops the request it is generating between two tokens and returns what it has,
``stop_reason`` ``"aborted"``, with a logprob per id; a request that arrives (or waits for the model) while the gate is
closed is parked until the resume, or answered at once, aborted with no ids, after ``reject_request=True``. The
version a request is generated on is read when it takes the model (the weights cannot change while it holds it),
which is what the engine's report stamps as the version at dispatch (``verl_ext.core.version_spans``).

TEST ONLY (``rollout.engine_kwargs.verl_ext_cpu``): the ``abort_after`` fault (cpu_faults.py) parks one request per
served version after ``tokens`` sampled ids, with the model released, until verl's next abort: the abort then lands
after exactly that many ids whatever the timing, so a trainer run resumes a turn deterministically. ``truth_log``
names a JSONL file where the engine writes, per request, the version that generated its ids: what a test compares the
recorded version spans with.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verl_ext.core.bounded_cache import LruCache

logger = logging.getLogger(__name__)

ABORTED = "aborted"  # verl's TokenOutput.stop_reason for an aborted request (its resume client retries on it)


def ids_digest(ids: Sequence[int]) -> str:
    """A short digest of a token id sequence (the truth log's key for a request's prompt + output)."""
    return hashlib.blake2b(b",".join(str(int(i)).encode() for i in ids), digest_size=12).hexdigest()


class GenerationGate:
    """The engine's admission gate and the stop flag its generation thread reads between tokens."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._abort_waiters: list[asyncio.Future[None]] = []  # parked requests, woken by the next abort
        self._stop = threading.Event()  # read by the generation thread after every id
        self.rejecting = False
        self.aborts = 0

    @property
    def paused(self) -> bool:
        return not self._open.is_set()

    async def admit(self) -> bool:
        """Wait while the gate is closed; False: it is closed with ``reject_request`` (answer aborted at once)."""
        while not self._open.is_set():
            if self.rejecting:
                return False
            await self._open.wait()
        return True

    def stop_requested(self) -> bool:
        """Whether the request being generated must stop now (thread-safe)."""
        return self._stop.is_set()

    def abort(self, reject_request: bool = False) -> None:
        """verl's ``abort_all_requests``: stop the request in flight, close the gate until ``resume``."""
        self.aborts += 1
        self.rejecting = bool(reject_request)
        self._open.clear()
        self._stop.set()
        waiters, self._abort_waiters = self._abort_waiters, []
        for woken in waiters:
            if not woken.done():
                woken.set_result(None)

    def resume(self) -> None:
        """verl's ``resume_generation``: open the gate; parked requests go on, on the weights served now."""
        self.rejecting = False
        self._stop.clear()
        self._open.set()

    async def wait_for_abort(self, since: int, timeout_s: float) -> bool:
        """Wait for an abort after the ``since``-th (``since`` is ``aborts`` when the request parked); False when none
        came within ``timeout_s``. The waiter is registered before this yields, so an abort and a resume that both
        come before it is first scheduled still wake it (an event cleared by the resume would not)."""
        if self.aborts > since:
            return True
        woken = asyncio.get_running_loop().create_future()
        self._abort_waiters.append(woken)
        try:
            await asyncio.wait_for(woken, timeout_s)
        except asyncio.TimeoutError:
            pass
        finally:
            if woken in self._abort_waiters:
                self._abort_waiters.remove(woken)
        return self.aborts > since


class ParkPlan:
    """TEST ONLY: which requests the ``abort_after`` fault parks. One per served version, never a forced turn and
    never a request that resumes an aborted one (it would be parked again at every version)."""

    def __init__(self, tokens: int | None, wait_s: float) -> None:
        self.tokens = tokens
        self.wait_s = wait_s
        self._parked_versions: set[Any] = set()
        self._aborted_streams: LruCache[str, bool] = LruCache("CPU engine aborted streams", 4096)

    def park_at(self, prompt_ids: Sequence[int], forced: int, version: Any) -> int | None:
        """How many ids the request may sample before it is parked (None: it is not)."""
        if self.tokens is None or forced or version in self._parked_versions:
            return None
        if self._aborted_streams.get(ids_digest(prompt_ids)):  # a resume of an aborted request
            return None
        self._parked_versions.add(version)
        return self.tokens

    def finished_unparked(self, version: Any) -> None:
        """A request chosen to be parked ended before its park point (a stop id came first): the next request of
        its version may be parked instead, so each version still resumes a turn."""
        self._parked_versions.discard(version)

    def aborted(self, prompt_ids: Sequence[int], token_ids: Sequence[int]) -> None:
        """Remember an aborted request's prompt + output: the request that resumes it is sent with these ids."""
        self._aborted_streams[ids_digest([*prompt_ids, *token_ids])] = True


class TruthLog:
    """TEST ONLY: one JSON line per request, the version that generated its ids (``truth_log``)."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()

    def write(self, prompt_ids: Sequence[int], token_ids: Sequence[int], version: Any, stop_reason: str) -> None:
        if self.path is None:
            return
        line = {
            "stream": ids_digest([*prompt_ids, *token_ids]),
            "prompt_len": len(prompt_ids),
            "ids": len(token_ids),
            "version": version,
            "stop_reason": stop_reason,
        }
        with self._lock, self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")


def read_truth(path: str | Path) -> dict[str, dict[str, Any]]:
    """A truth log by stream digest (prompt + output ids of each request)."""
    lines = [json.loads(x) for x in Path(path).read_text(encoding="utf-8").splitlines() if x.strip()]
    return {line["stream"]: line for line in lines}
