"""A length-cut turn through the openai SDK's helpers: what raises, and the pattern docs/gateway.md gives for RL.

The gateway answers a turn cut at ``max_tokens`` as OpenAI does (``finish_reason: "length"``). The SDK's parsing
helpers (``chat.completions.stream`` / ``parse``) raise ``LengthFinishReasonError`` on such a turn when the request
has parseable tools (``openai.pydantic_function_tool``, strict schemas); RL cuts many turns, so a harness catches it
and takes the partial turn from the error (``.completion``), or streams with ``create(stream=True)``, which never
raises for a cut turn.
"""

from __future__ import annotations

from typing import Any

import openai
import pydantic
import pytest

from verl_ext.gateway.server import ServerThread, create_app

LONG = "One two three four five six seven eight nine ten eleven twelve.<|im_end|>"


class Calculate(pydantic.BaseModel):
    """Evaluate an arithmetic expression."""

    expression: str


def test_the_stream_helper_raises_on_a_cut_turn_and_the_documented_pattern_reads_it(make_gateway: Any) -> None:
    gateway = make_gateway([LONG, LONG, LONG])
    server = ServerThread(create_app(gateway, "tiny-qwen3")).start()
    try:
        client = openai.OpenAI(base_url=f"{server.url}/sessions/s/v1", api_key="k", max_retries=0)
        messages = [{"role": "user", "content": "Count."}]
        tools = [openai.pydantic_function_tool(Calculate)]
        stream = client.chat.completions.stream(model="policy", messages=messages, tools=tools, max_tokens=4)
        with pytest.raises(openai.LengthFinishReasonError) as cut, stream as s:  # what a new user met
            for _ in s:
                pass
        # the pattern the docs give: the partial turn is on the error
        (choice,) = cut.value.completion.choices
        assert choice.finish_reason == "length" and choice.message.content == "One two three four"
        # and create(stream=True) reads a cut turn without raising
        parts, finish = [], None
        for chunk in client.chat.completions.create(
            model="policy", messages=messages, tools=tools, max_tokens=4, stream=True
        ):
            for c in chunk.choices:
                parts.append(c.delta.content or "")
                finish = c.finish_reason or finish
        assert (finish, "".join(parts)) == ("length", "One two three four")
    finally:
        server.stop()
    gateway.end("s")


@pytest.mark.parametrize("stream", [True, False])
def test_the_demo_harness_reads_a_turn_cut_at_the_budget(
    make_gateway: Any, stream: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The demo's harness on a real length cut: the gateway's branch budget (``response_length``) cuts the first turn
    at 4 tokens. Through the stream helper with the strict calculator (which raises ``LengthFinishReasonError``, the
    first test) and through ``create()``, the harness ends the row with the partial answer and ``finish: length``,
    and the session's record keeps the cut turn."""
    import asyncio

    from verl_ext.demo import harness

    gateway = make_gateway([LONG], response_length=4)
    server = ServerThread(create_app(gateway, "tiny-qwen3")).start()
    row = {"raw_prompt": [{"role": "user", "content": "Count."}]}

    def run(session: str) -> dict[str, Any]:
        url = f"{server.url}/sessions/{session}/v1"
        return asyncio.run(harness.run(url, "k", row, stream=stream, tools=[harness.STRICT_CALCULATOR]))

    try:
        result = run("h")
        if stream:  # the harness without its except clause: the helper's error reaches the caller
            monkeypatch.setattr(harness, "LengthFinishReasonError", type("NeverRaised", (Exception,), {}))
            with pytest.raises(openai.LengthFinishReasonError):
                run("mutant")
    finally:
        server.stop()
    assert result == {"answer": "One two three four", "turns": 1, "tool_calls": 0, "finish": "length"}
    (branch,) = gateway.end("h")
    assert branch.result.engine_ok and branch.result.num_sampled == 4
