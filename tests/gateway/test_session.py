"""The gateway's core on the real Qwen3 tokenizer and the CPU engine: matching, forks, budget, records."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from gateway_fixtures import CALL, TOOLS

from verl_ext.gateway.errors import GatewayError
from verl_ext.gateway.request import parse_chat_request
from verl_ext.telemetry.records import read_records

THINK_ANSWER = "<think>\nThe tool said %s.\n</think>\n\nThe answer is %s.<|im_end|>"


def ask(gateway: Any, session: str, messages: list[dict[str, Any]], **body: Any) -> Any:
    request = parse_chat_request({"messages": messages, "tools": TOOLS, "max_tokens": 64, **body})
    return asyncio.run(gateway.complete(session, request))


def first_turn(gateway: Any, session: str = "s") -> tuple[list[dict[str, Any]], Any]:
    messages = [{"role": "user", "content": "What is 6*7?"}]
    done = ask(gateway, session, messages)
    return messages, done


def reply(messages: list[dict[str, Any]], assistant: dict[str, Any], result: str) -> list[dict[str, Any]]:
    call_id = assistant["tool_calls"][0]["id"]
    return [*messages, assistant, {"role": "tool", "tool_call_id": call_id, "content": result}]


def test_tool_call_turn_is_parsed_and_its_ids_are_the_engines(make_gateway: Any, gateway_parts: Any) -> None:
    gateway = make_gateway([CALL % "6*7"])
    _, done = first_turn(gateway)
    assert done.finish_reason == "tool_calls"
    (call,) = done.message["tool_calls"]
    assert call["function"]["name"] == "calc"
    assert json.loads(call["function"]["arguments"]) == {"expression": "6*7"}
    assert list(done.token_ids) == gateway_parts["tokenizer"].encode(CALL % "6*7", add_special_tokens=False)
    branch = gateway.sessions["s"].branches[0]
    assert branch.trajectory.input_ids[-len(done.token_ids) :] == list(done.token_ids)


def test_dropped_reasoning_and_reserialized_arguments_continue_the_branch(make_gateway: Any) -> None:
    gateway = make_gateway([CALL % "6*7", THINK_ANSWER % (42, 42), CALL % "1+1"])
    messages, done = first_turn(gateway)
    assistant = dict(done.message)
    # re-serialize the arguments as a harness would (no spaces, other key order is irrelevant for one key)
    args = json.loads(assistant["tool_calls"][0]["function"]["arguments"])
    assistant["tool_calls"] = [
        {
            **assistant["tool_calls"][0],
            "function": {"name": "calc", "arguments": json.dumps(args, separators=(",", ":"))},
        }
    ]
    messages = reply(messages, assistant, "42")
    second = ask(gateway, "s", messages)
    assert second.finish_reason == "stop"
    assert second.message["content"] == "The answer is 42."
    assert second.message["reasoning_content"] == "The tool said 42."
    # the harness drops the reasoning and asks again
    messages += [{"role": "assistant", "content": second.message["content"]}, {"role": "user", "content": "And 1+1?"}]
    third = ask(gateway, "s", messages)
    assert third.fork is None and third.branch == 0
    session = gateway.sessions["s"]
    assert len(session.branches) == 1
    stream = session.branches[0].trajectory.input_ids
    text = gateway.renderer.decode(stream)
    assert "<think>\nThe tool said 42.\n</think>" in text  # the stream keeps what was sampled
    assert gateway.counters["forks"] == 0
    (result,) = gateway.end("s")
    assert result.result.engine_ok, result.result.engine_failures


def test_echoed_reasoning_in_content_matches(make_gateway: Any) -> None:
    gateway = make_gateway([THINK_ANSWER % (1, 1), THINK_ANSWER % (2, 2)])
    messages, done = first_turn(gateway)
    full = "<think>\nThe tool said 1.\n</think>\n\nThe answer is 1."
    messages += [{"role": "assistant", "content": full}, {"role": "user", "content": "again"}]
    again = ask(gateway, "s", messages)
    assert again.fork is None


def test_edited_tool_result_forks_once_and_keeps_the_sampled_turn(make_gateway: Any) -> None:
    gateway = make_gateway([CALL % "6*7", THINK_ANSWER % (42, 42)])
    messages, done = first_turn(gateway)
    ask(gateway, "s", reply(messages, done.message, "42"))
    edited = ask(gateway, "s", reply(messages, done.message, "41"))
    assert edited.fork is not None
    assert edited.fork.divergence.index == 2 and edited.fork.divergence.field == "content"
    assert edited.fork.replayed_turns == 1 and edited.fork.parent == 0
    session = gateway.sessions["s"]
    parent, child = session.branches
    first_end = parent.calls[0].output_end
    assert child.trajectory.input_ids[:first_end] == parent.trajectory.input_ids[:first_end]
    assert gateway.counters["forks"] == 1
    results = gateway.end("s")
    assert [r.branch for r in results] == [0, 1]
    assert all(r.result.engine_ok for r in results)
    assert results[1].rollout.extra["gateway"]["fork"]["field"] == "content"


def test_continuing_a_fork_does_not_fork_again(make_gateway: Any) -> None:
    gateway = make_gateway([CALL % "6*7", CALL % "6*8", THINK_ANSWER % (48, 48)])
    messages, done = first_turn(gateway)
    ask(gateway, "s", reply(messages, done.message, "42"))
    forked = ask(gateway, "s", reply(messages, done.message, "41"))
    follow = reply(reply(messages, done.message, "41"), forked.message, "48")
    last = ask(gateway, "s", follow)
    assert last.fork is None and last.branch == 1
    assert len(gateway.sessions["s"].branches) == 2


def test_retried_turn_forks_with_missing_field(make_gateway: Any) -> None:
    gateway = make_gateway([CALL % "6*7"])
    messages, _ = first_turn(gateway)
    retry = ask(gateway, "s", messages)
    assert retry.fork is not None and retry.fork.divergence.field == "missing"
    assert retry.fork.replayed_turns == 0


def test_edited_assistant_message_starts_from_the_request(make_gateway: Any) -> None:
    gateway = make_gateway([CALL % "6*7", THINK_ANSWER % (42, 42)])
    messages, done = first_turn(gateway)
    changed = {**done.message, "content": "Let me compute."}
    out = ask(gateway, "s", reply(messages, changed, "42"))
    assert out.fork.divergence.index == 1 and out.fork.divergence.field == "content"
    assert out.fork.replayed_turns == 0
    results = gateway.end("s")
    assert all(r.result.engine_ok for r in results)


def test_changed_arguments_and_reasoning_are_named(make_gateway: Any) -> None:
    gateway = make_gateway([CALL % "6*7", THINK_ANSWER % (42, 42), CALL % "x"])
    messages, done = first_turn(gateway)
    changed = {**done.message, "tool_calls": [{**done.message["tool_calls"][0]}]}
    changed["tool_calls"][0]["function"] = {"name": "calc", "arguments": '{"expression": "6*8"}'}
    out = ask(gateway, "s", reply(messages, changed, "48"))
    assert out.fork.divergence.field == "tool_calls[0].function.arguments"
    messages = reply(messages, done.message, "42")
    second = ask(gateway, "s", messages)
    wrong = {"role": "assistant", "content": second.message["content"], "reasoning_content": "other thoughts"}
    out = ask(gateway, "s", [*messages, wrong, {"role": "user", "content": "ok"}])
    assert out.fork.divergence.field == "reasoning_content" and out.fork.divergence.index == 3


def test_branch_cap_ends_the_session_with_records(make_gateway: Any, tmp_path: Any) -> None:
    gateway = make_gateway([CALL % "1"], max_branches=2)
    messages, _ = first_turn(gateway)
    ask(gateway, "s", messages)  # a retry: branch 2
    with pytest.raises(GatewayError) as info:
        ask(gateway, "s", messages)
    assert info.value.status == 409 and info.value.code == "too_many_branches"
    assert "messages[1]" in info.value.param
    with pytest.raises(GatewayError) as again:
        ask(gateway, "s", messages)
    assert again.value.status == 409 and again.value.code == "session_finished"
    _, rollouts = read_records(sorted((tmp_path / "records").glob("*.jsonl")))
    assert len(rollouts) == 2


def test_token_budget_is_enforced_across_calls(make_gateway: Any) -> None:
    gateway = make_gateway([CALL % "6*7", "x " * 80 + "<|im_end|>"], response_length=60)
    messages, done = first_turn(gateway)
    spent = len(done.token_ids)
    second = ask(gateway, "s", reply(messages, done.message, "42"))
    assert second.finish_reason == "length"
    branch = gateway.sessions["s"].branches[0]
    assert branch.response_tokens <= 60 + 2  # the synthetic close added at the end is outside any engine call
    assert spent + len(second.token_ids) <= 60
    third = ask(gateway, "s", [*reply(messages, done.message, "42"), second.message, {"role": "user", "content": "?"}])
    assert third.finish_reason == "length" and third.token_ids == ()


def test_unknown_and_ended_sessions(make_gateway: Any) -> None:
    gateway = make_gateway([CALL % "1"], open_on_demand=False)
    with pytest.raises(GatewayError) as unknown:
        first_turn(gateway, "nope")
    assert unknown.value.status == 404
    gateway.open("s")
    first_turn(gateway, "s")
    gateway.end("s")
    with pytest.raises(GatewayError) as ended:
        first_turn(gateway, "s")
    assert ended.value.status == 409


def test_records_are_readable_and_name_the_fork(make_gateway: Any, tmp_path: Any) -> None:
    gateway = make_gateway([CALL % "6*7", THINK_ANSWER % (42, 42)])
    messages, done = first_turn(gateway)
    ask(gateway, "s", reply(messages, done.message, "42"))
    ask(gateway, "s", reply(messages, done.message, "40"))
    gateway.end("s")
    headers, rollouts = read_records(sorted((tmp_path / "records").glob("*.jsonl")))
    assert len(headers) == 1 and len(rollouts) == 2
    assert rollouts[1].extra["gateway"]["fork"] == {
        "parent": 0,
        "replayed_turns": 1,
        "message": 2,
        "field": "content",
        "detail": "content: '42' -> '40'",
    }
    assert all(r.check.engine_ok for r in rollouts)


def test_multi_token_stop_is_refused_before_anything_changes(make_gateway: Any) -> None:
    gateway = make_gateway([CALL % "1"])
    with pytest.raises(GatewayError) as info:
        ask(gateway, "s", [{"role": "user", "content": "hi"}], stop=["The answer"])
    assert info.value.status == 400 and info.value.param == "stop"
    assert not gateway.sessions["s"].branches


class _NanEngine:
    """A fault stand-in: the engine returns a turn whose second logprob is NaN (as SGLang does after a NaN)."""

    max_context = None

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    async def generate(self, prompt_ids: Any, sampling: Any) -> Any:
        from verl_ext.gateway.engine import Sampled

        return Sampled(tuple(self.ids), tuple(float("nan") if i == 1 else -0.5 for i in range(len(self.ids))))


def test_invalid_engine_output_ends_the_branch_and_the_check_names_it(make_gateway: Any, gateway_parts: Any) -> None:
    gateway = make_gateway()
    ids = gateway_parts["tokenizer"].encode("Hello there.<|im_end|>", add_special_tokens=False)
    gateway.engine = _NanEngine(ids)
    messages, done = first_turn(gateway)
    assert done.finish_reason == "length" and done.message["content"] == ""
    assert gateway.counters["invalid_engine_output"] == 1
    again = ask(gateway, "s", [*messages, done.message, {"role": "user", "content": "more?"}])
    assert again.finish_reason == "length" and again.token_ids == ()  # the branch takes no further turn
    (result,) = gateway.end("s")
    assert not result.result.engine_ok  # the check names the invalid output: nothing of it is trained unseen


def test_the_retry_a_late_refusal_asks_for_continues_the_branch(make_gateway: Any, gateway_parts: Any) -> None:
    """A request refused after its branch was prepared (a max_tokens past the room left) leaves nothing of its new
    message in the session: the retry the 400 tells the client to make, the same messages with a budget that fits,
    continues branch 0 rather than forking one."""
    context = gateway_parts["engine"].max_context
    gateway = make_gateway([THINK_ANSWER % (1, 1), THINK_ANSWER % (2, 2)])
    messages, done = first_turn(gateway)
    messages += [{"role": "assistant", "content": done.message["content"]}, {"role": "user", "content": "again"}]
    with pytest.raises(GatewayError) as refused:
        ask(gateway, "s", messages, max_tokens=context)
    assert refused.value.status == 400 and refused.value.code == "context_length_exceeded", refused.value
    retry = ask(gateway, "s", messages)
    assert retry.fork is None and retry.branch == 0
    assert len(gateway.sessions["s"].branches) == 1 and gateway.counters["forks"] == 0
    (result,) = gateway.end("s")
    assert result.result.engine_ok and result.result.num_turns == 2, result.result


def test_a_session_that_crosses_midnight_is_checked_and_recorded_with_its_own_date(
    make_gateway: Any, gateway_parts: Any
) -> None:
    """A template that stamps the date (as Llama 3.2's does): a session whose branch started yesterday is checked
    after midnight. Its record carries the branch's clock, so the check re-renders yesterday's date (no finding)
    and the record replays; without it the check read today's date and flagged the prompt."""
    from verl_ext.core.rendering import ChatRenderer

    tokenizer = gateway_parts["tokenizer"]
    stamp = "{{- '<|im_start|>system\\nToday Date: ' + strftime_now('%d %b %Y') + '<|im_end|>\\n' }}"
    renderer = ChatRenderer(tokenizer, chat_template=stamp + tokenizer.chat_template)  # the wall clock's date
    assert renderer.reads_clock
    gateway = make_gateway(["Hello.<|im_end|>"], renderer=renderer)  # its records replay with this template
    yesterday = "2026-11-25T23:59:00"
    gateway.open("s").clock = yesterday  # the session's clock, as pinned by a first branch started yesterday
    done = ask(gateway, "s", [{"role": "user", "content": "Hi"}])
    assert "Today Date: 25 Nov 2026" in renderer.decode(gateway.sessions["s"].branches[0].trajectory.input_ids)
    assert done.finish_reason == "stop"
    (result,) = gateway.end("s")
    assert result.result.ok and not result.result.defects, [(f.cause.value, f.detail) for f in result.result.defects]
    (line,) = [json.loads(x) for x in gateway.writer.path.read_text().splitlines() if '"rollout"' in x]
    assert line["template_clock"] == yesterday
