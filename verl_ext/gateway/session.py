"""A session: the branches one client conversation has produced, and which branch a request continues.

A request continues the branch whose messages it repeats in full (and adds tool, user or system messages to).
Any other request departs from the session: it forks a new branch from the longest matching prefix (over every
branch), named by the message index and field that differed. Nothing is merged silently and no branch is
changed by another's request.

A harness sends back the history it sent before: the messages the last request's branch was sent are kept (a copy),
and a request that starts with them, as sent, is matched that far by one comparison at C speed (``==`` of the lists,
no allocation), without reading them again (no message is checked, normalized or hashed twice). The messages after
them are matched by ``history``'s digests. Only messages of strings, lists, dicts and nulls are kept: there ``==`` is
exact (numbers compare across types, ``1 == 1.0 == True``), and a message holding any other value ends the kept
prefix, so what follows it is matched by its digests.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_ext.core.prompt_ids import PromptIds
from verl_ext.gateway.branch import Branch, Fork
from verl_ext.gateway.errors import GatewayError
from verl_ext.gateway.history import ROOT, Divergence, chain, divergence, message_key, reasoning_differs, tools_key
from verl_ext.runtime import LiveRollout


@dataclass
class _Sent:
    """Messages a request sent a branch, known to match its first ``count`` messages: a copy of them (``_plain``)."""

    messages: list[Any] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.messages)


@dataclass(frozen=True)
class Mark:
    """What a session was before a request (``Session.mark``), so a request that fails after ``prepare`` can be
    undone (``Session.undo``): the branch count, each branch's message count, the last branch and how many of the
    messages sent to each were kept."""

    branches: int
    held: tuple[int, ...]
    last: Branch | None
    sent: dict[int, tuple[_Sent, int]]


@dataclass(frozen=True)
class Prepared:
    """Where a request's turn goes: the branch, the prompt for the engine (None when the branch's token budget
    is spent), and the fork the request started (None when it continued a branch)."""

    branch: Branch
    prompt: PromptIds | None
    fork: Fork | None


class Session:
    """One client conversation (module docstring). Requests are served one at a time (``lock``)."""

    def __init__(
        self, session_id: str, new_rollout: Callable[[str | None], LiveRollout], *, max_branches: int = 8
    ) -> None:
        self.id = session_id
        self.new_rollout = new_rollout  # a new rollout reading the given clock (None: now)
        self.max_branches = max_branches
        # The time the session's template reads (pinned with its first branch): every branch of it, and a branch
        # rebuilt by ``undo``, renders the same date, so a fork replays its parent's prompt as it was sampled.
        self.clock: str | None = None
        # What each branch's record says of the data row the session serves (the in-training loop sets the row's
        # training step, data source, index and trainer mode; the standalone gateway names the session).
        self.row: dict[str, Any] = {"step": 0, "data_source": "gateway", "index": session_id}
        self.branches: list[Branch] = []
        self.ended: str | None = None  # why the session ended, once it has
        self.concluded = False  # its branches are checked and recorded
        self.lock = asyncio.Lock()
        self._index: dict[bytes, tuple[int, int]] = {}  # digest of (tools, first n messages) -> (branch, n)
        self._registered: dict[int, int] = {}  # branch -> digests registered so far
        self._sent: dict[int, _Sent] = {}  # branch -> the first messages a request sent it, known to match them
        self._last: Branch | None = None  # the branch the last request went to: the next one most likely repeats it
        self._tools: tuple[Sequence[Mapping[str, Any]] | None, bytes] | None = None  # the last tools and their digest

    def match(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> tuple[Branch | None, int]:
        """The branch holding the longest prefix of ``messages`` (with the same tools), and its length in
        messages. The messages the last request's branch was sent, repeated as sent, cost one comparison with the
        kept copy (``_known_prefix``, at C speed); each later message is read, hashed and looked up once."""
        branch, matched, _ = self._match(messages, tools)
        return branch, matched

    def _match(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None
    ) -> tuple[Branch | None, int, int]:
        """``match``, and the length of the prefix known from the last branch's raw messages (0: none)."""
        digest = self._tools_digest(tools)
        if digest not in self._index:
            return None, 0, 0
        best: tuple[Branch | None, int] = (self.branches[self._index[digest][0]], 0)
        known = self._known_prefix(messages, digest)
        if known:
            assert self._last is not None
            best, digest = (self._last, known), self._last.digests[known]
        for i in range(known, len(messages)):
            message = messages[i]
            digest = chain(digest, message_key(message))
            hit = self._index.get(digest)
            if hit is None:
                break
            branch = self.branches[hit[0]]
            if message["role"] == "assistant" and reasoning_differs(message, branch.messages[i]):
                break
            best = (branch, i + 1)
        return best[0], best[1], known

    def _known_prefix(self, messages: Sequence[Mapping[str, Any]], tools_digest: bytes) -> int:
        """How many leading messages of the request are, as sent, the messages kept for the last branch (all of
        them or none): ``==`` against the kept copy, at C speed, with no message read, checked or hashed in Python
        (exact: the kept messages hold strings, lists, dicts and nulls only, and a string equals only a string)."""
        raw, last = getattr(messages, "raw", None), self._last
        if raw is None or last is None or last.digests[0] != tools_digest:
            return 0
        sent = self._sent.get(last.number)
        if sent is None or not sent.count or len(raw) < sent.count:
            return 0
        try:
            same = raw[: sent.count] == sent.messages
        except Exception:  # a caller's own object whose == raises: its messages are read one by one, as without a copy
            return 0
        return sent.count if same else 0

    def _tools_digest(self, tools: Sequence[Mapping[str, Any]] | None) -> bytes:
        """The digest of no messages with these tools (the last request's, when they are equal)."""
        if self._tools is None or self._tools[0] != tools:
            self._tools = (copy.deepcopy(tools), chain(ROOT, tools_key(tools)))
        return self._tools[1]

    def prepare(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None) -> Prepared:
        """Continue the branch the request repeats, or fork one (raises ``GatewayError`` 409 over the branch cap,
        or 400 for a malformed message)."""
        branch, matched, known = self._match(messages, tools)
        _ = messages[matched:]  # read: every message the session does not hold is checked before anything changes
        prepared = self._prepare(messages, tools, branch, matched)
        self._keep_sent(prepared.branch, messages, known if prepared.branch is self._last else 0)
        self._last = prepared.branch
        return prepared

    def mark(self) -> Mark:
        """The session as it is now, for ``undo``."""
        sent = {number: (kept, kept.count) for number, kept in self._sent.items()}
        return Mark(len(self.branches), tuple(len(b.messages) for b in self.branches), self._last, sent)

    def undo(self, mark: Mark) -> None:
        """Put the session back as it was at ``mark``: a request that failed after ``prepare`` (its prompt past the
        engine's context, a fault of the server) leaves no trace, and the client may retry it. A branch started
        since is dropped; a branch a request appended to is rebuilt from its log up to the messages it held (its
        engine turns replayed as sampled, as a fork replays them)."""
        for branch in self.branches[mark.branches :]:
            self._unregister(branch.number, 0)
            self._registered.pop(branch.number, None)
        del self.branches[mark.branches :]
        for number, held in enumerate(mark.held):
            branch = self.branches[number]
            if len(branch.messages) != held:
                self.branches[number] = self._rebuilt(branch, held)
                self._unregister(number, held + 1)
                self._registered[number] = min(self._registered.get(number, 0), held + 1)
        self._sent = {}
        for number, (kept, count) in mark.sent.items():
            del kept.messages[count:]
            self._sent[number] = kept
        self._last = None if mark.last is None else self.branches[mark.last.number]

    def _rebuilt(self, branch: Branch, held: int) -> Branch:
        """``branch`` as it was when it held its first ``held`` messages."""
        child = Branch(branch.number, self._rollout(), branch.fork)
        previous = branch.replay_into(child, held)
        if not previous:
            child.start(branch.first_messages, branch.tools)
            previous = len(branch.first_messages)
        if held > previous:
            child.append(branch.messages[previous:held])
        child.exhausted = branch.exhausted
        return child

    def _unregister(self, number: int, start: int) -> None:
        """Drop the index entries of branch ``number``'s digests from ``start`` on."""
        for key in [k for k, (b, n) in self._index.items() if b == number and n >= start]:
            del self._index[key]

    def _keep_sent(self, branch: Branch, messages: Sequence[Mapping[str, Any]], known: int) -> None:
        """Keep the request's messages as sent for ``branch``, as far as it holds them (an exhausted branch does not
        take the new ones), as a copy (a caller may change its objects afterwards), up to the first message that is
        not plain (``_plain``). The first ``known`` are kept already; a turn adds only its new messages."""
        raw = getattr(messages, "raw", None)
        if raw is None:
            return
        held = min(len(raw), len(branch.messages))
        sent = self._sent.get(branch.number) if known else None
        if sent is None:
            sent = self._sent[branch.number] = _Sent()
        for message in raw[sent.count : held]:
            copied = _plain(message)
            if copied is None:  # kept no further: the next request starts again at this message, matched by digests
                break
            sent.messages.append(copied)

    def _prepare(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        branch: Branch | None,
        matched: int,
    ) -> Prepared:
        if not self.branches:
            return Prepared(self._new_branch(messages, tools, None), self.branches[-1].trajectory.prompt_ids(), None)
        if branch is not None and matched == len(branch.messages):
            pending = messages[matched:]
            if branch.exhausted:
                return Prepared(branch, None, None)
            unsampled = _first_assistant(pending)
            if unsampled is None:
                prompt = branch.append(pending)
                self._register(branch)
                return Prepared(branch, prompt, None)
            why = Divergence(matched + unsampled, "role", "an assistant message the engine did not sample")
        elif branch is None:
            branch = self.branches[0]
            why = Divergence(0, "tools", "the request's tools differ from the session's")
        else:
            why = divergence(messages, branch.messages, matched)
        return self._fork(branch, matched, messages, tools, why)

    def _fork(
        self,
        parent: Branch,
        matched: int,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        why: Divergence,
    ) -> Prepared:
        if len(self.branches) >= self.max_branches:
            self.ended = f"over its limit of {self.max_branches} branches"
            raise GatewayError(
                409,
                f"session {self.id!r}: the request departs from the session at messages[{why.index}] ({why.field}: "
                f"{why.detail}), which would start branch {len(self.branches) + 1}, over the session's limit of "
                f"{self.max_branches}; the session has ended and its branches are recorded. Send the history the "
                "gateway returned (or raise the branch limit)",
                type="invalid_request_error",
                param=f"messages[{why.index}]",
                code="too_many_branches",
            )
        keep = parent.kept_end(matched) if tools_key(tools) == tools_key(parent.tools) else 0
        if keep and _first_assistant(messages[keep:]) is not None:
            keep = 0  # an assistant message the engine did not sample: the new branch starts from the request
        child = Branch(len(self.branches), self._rollout(), None)
        if keep:
            parent.replay_into(child, keep)
            prompt = child.append(messages[keep:])
        else:
            prompt = child.start(messages, tools)
        child.fork = Fork(parent.number, why, len(child.turns))
        self.branches.append(child)
        self._register(child)
        return Prepared(child, prompt, child.fork)

    def _new_branch(
        self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None, fork: Fork | None
    ) -> Branch:
        branch = Branch(len(self.branches), self._rollout(), fork)
        branch.start(messages, tools)
        self.branches.append(branch)
        self._register(branch)
        return branch

    def _rollout(self) -> LiveRollout:
        """A new branch's rollout, on the session's clock (pinned by the first)."""
        rollout = self.new_rollout(self.clock)
        if self.clock is None:
            self.clock = rollout.clock
        return rollout

    def register(self, branch: Branch) -> None:
        """Index the branch's messages added since the last call (after a turn was added to it)."""
        self._register(branch)

    def _register(self, branch: Branch) -> None:
        start = self._registered.get(branch.number, 0)
        for n in range(start, len(branch.digests)):
            self._index.setdefault(branch.digests[n], (branch.number, n))
        self._registered[branch.number] = len(branch.digests)


def _plain(value: Any) -> Any:
    """A copy of ``value`` when it is made of strings, nulls, lists and dicts with string keys only (what ``==``
    compares exactly, type for type), else None. JSON numbers and booleans compare across types (``1 == 1.0 ==
    True``) where the gateway reads them apart (a tool call's arguments as an object), so a message holding one is not
    kept. Strings are shared, not copied (immutable)."""
    if value is None or type(value) is str:
        return value
    if type(value) is list:
        items = [_plain(v) for v in value]
        return None if any(c is None and v is not None for c, v in zip(items, value, strict=True)) else items
    if type(value) is dict:
        out = {}
        for key, item in value.items():
            copied = _plain(item)
            if type(key) is not str or (copied is None and item is not None):
                return None
            out[key] = copied
        return out
    return None


def _first_assistant(messages: Sequence[Mapping[str, Any]]) -> int | None:
    return next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
