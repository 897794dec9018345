"""History matching reads only what a session does not hold: a request repeating, as sent, the messages its branch
was sent before costs one comparison with the kept copy of them, and only its new messages are
checked, normalized and hashed. Each shortcut is shown to be sound: a caller changing its own objects, other tools,
or a malformed new message still fork or fail as before."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from gateway_fixtures import CALL, TOOLS

from verl_ext.gateway import session as session_module
from verl_ext.gateway.errors import GatewayError
from verl_ext.gateway.request import parse_chat_request

TURNS = 3


def from_json(body: dict[str, Any]) -> Any:
    """The request as the server reads it: fresh objects from JSON text."""
    return parse_chat_request(json.loads(json.dumps(body)))


def harness(gateway: Any, turns: int = TURNS) -> list[int]:
    """A harness that drops reasoning and re-serializes arguments; returns how many messages each request read."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Compute."}]
    reads = []
    for k in range(turns):
        request = from_json({"messages": messages, "tools": TOOLS, "max_tokens": 64})
        done = asyncio.run(gateway.complete("s", request))
        assert done.fork is None
        reads.append(request.messages.read)
        call = done.message["tool_calls"][0]
        arguments = json.dumps(json.loads(call["function"]["arguments"]), separators=(",", ":"))
        assistant = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{**call, "function": {**call["function"], "arguments": arguments}}],
        }
        messages = [*messages, assistant, {"role": "tool", "tool_call_id": call["id"], "content": str(k)}]
    return reads


def test_a_continued_request_reads_only_its_new_messages(make_gateway: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    assert harness(make_gateway([CALL % k for k in range(TURNS)])) == [1, 2, 2]
    # without the kept raw messages every request reads its whole history: the count above tells them apart
    monkeypatch.setattr(session_module.Session, "_known_prefix", lambda *_: 0)
    assert harness(make_gateway([CALL % k for k in range(TURNS)]), 2) == [1, 3]


@pytest.mark.parametrize("verified", [True, False])
def test_a_message_the_caller_changes_in_place_still_forks(
    verified: bool, make_gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kept messages are a snapshot, compared by value: a caller that changes its own objects after sending
    them (the dict the session saw) still forks. The defect this catches: a known prefix trusted by its length."""
    if not verified:
        monkeypatch.setattr(session_module.Session, "_known_prefix", trusted_by_length)
    gateway = make_gateway([CALL % k for k in range(3)])
    first = [{"role": "user", "content": "Compute."}]
    done = asyncio.run(gateway.complete("s", parse_chat_request({"messages": first, "tools": TOOLS})))
    tool = {"role": "tool", "tool_call_id": done.message["tool_calls"][0]["id"], "content": "0"}
    first = [*first, dict(done.message), tool]
    asyncio.run(gateway.complete("s", parse_chat_request({"messages": first, "tools": TOOLS})))
    tool["content"] = "edited"  # the same dict, changed after it was sent
    done = asyncio.run(gateway.complete("s", parse_chat_request({"messages": first, "tools": TOOLS})))
    if verified:
        assert done.fork is not None and (done.fork.divergence.index, done.fork.divergence.field) == (2, "content")
    else:  # the edit goes unseen: the request reads as a retry of the kept messages
        assert done.fork is not None and done.fork.divergence.field == "missing"


def trusted_by_length(session: Any, messages: Any, tools_digest: bytes) -> int:
    sent = session._sent.get(session._last.number) if session._last else None
    return sent.count if sent and len(messages) >= sent.count else 0


def sent_messages(session: Any) -> list[dict[str, Any]]:
    """The messages the session keeps for its first branch, as sent (a copy of the kept copy)."""
    return copy.deepcopy(session._sent[0].messages)


def test_the_same_messages_with_other_tools_fork_on_tools(make_gateway: Any) -> None:
    gateway = make_gateway([CALL % k for k in range(TURNS)])
    harness(gateway, 2)
    session = gateway.sessions["s"]
    sent = sent_messages(session)
    other = [{**TOOLS[0], "function": {**TOOLS[0]["function"], "description": "Another calculator."}}]
    done = asyncio.run(gateway.complete("s", from_json({"messages": sent, "tools": other})))
    assert done.fork is not None and done.fork.divergence.field == "tools"


def test_a_malformed_new_message_is_refused_and_changes_nothing(make_gateway: Any) -> None:
    gateway = make_gateway([CALL % k for k in range(TURNS)])
    harness(gateway, 2)
    session = gateway.sessions["s"]
    sent, held = sent_messages(session), len(session.branches[0].messages)
    bad = [
        *sent[:-1],
        {"role": "tool", "tool_call_id": sent[-1]["tool_call_id"], "content": 5},
        {"role": "user", "content": "?"},
    ]
    with pytest.raises(GatewayError) as info:
        asyncio.run(gateway.complete("s", from_json({"messages": bad, "tools": TOOLS})))
    assert info.value.status == 400 and info.value.param == f"messages[{len(sent) - 1}]"
    assert len(session.branches) == 1 and len(session.branches[0].messages) == held
    done = asyncio.run(gateway.complete("s", from_json({"messages": sent, "tools": TOOLS})))
    assert done.fork is not None and done.fork.divergence.field == "missing"  # a retry: as before the bad request


NUMBER_CALL = '<tool_call>\n{"name": "calc", "arguments": {"expression": 1}}\n</tool_call><|im_end|>'


@pytest.mark.parametrize("guarded", [True, False])
def test_a_kept_number_is_not_equal_to_a_boolean(
    guarded: bool, make_gateway: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``1 == True`` in Python, but the gateway reads them apart (arguments sent as an object: ``{"expression":1}``
    against ``{"expression":true}``): a message holding a number is not kept, so a request changing it to a boolean
    is matched by digests and forks. The defect this catches: a kept copy compared with ``==`` whatever it holds."""
    if not guarded:
        monkeypatch.setattr(session_module, "_plain", copy.deepcopy)
    gateway = make_gateway([NUMBER_CALL] * 3)
    first = [{"role": "user", "content": "Compute."}]
    done = asyncio.run(gateway.complete("s", from_json({"messages": first, "tools": TOOLS})))
    call = done.message["tool_calls"][0]
    sent = {**call, "function": {**call["function"], "arguments": {"expression": 1}}}  # as an object
    history = [*first, {"role": "assistant", "content": None, "tool_calls": [sent]}]
    history.append({"role": "tool", "tool_call_id": call["id"], "content": "1"})
    assert asyncio.run(gateway.complete("s", from_json({"messages": history, "tools": TOOLS}))).fork is None
    history[1]["tool_calls"][0]["function"]["arguments"] = {"expression": True}
    done = asyncio.run(gateway.complete("s", from_json({"messages": history, "tools": TOOLS})))
    if guarded:
        assert done.fork is not None and done.fork.divergence.field == "tool_calls[0].function.arguments"
    else:  # read as a retry of the kept messages
        assert done.fork is not None and done.fork.divergence.field == "missing"
