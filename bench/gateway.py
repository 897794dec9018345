"""Gateway overhead per turn: the gateway against the built-in loop's bookkeeping, on the same conversations.

Each conversation is a tool call then a short tool result, turn after turn, on the real Qwen3 tokenizer. The engine
is excluded: it answers every call with the same tool-call ids at once (a replay stand-in), so what is timed is the
bookkeeping each side adds around it:

- ``builtin``: what ``verl_ext_tool_agent`` does per turn: the engine call's record, verl's hermes parser,
  ``add_sampled`` and ``append_messages`` on the trajectory;
- ``gateway``: ``Gateway.complete`` in process on the request a harness sends (the whole history, arguments
  re-serialized, reasoning dropped): the request checked, its history matched, the tool result appended, the turn
  parsed;
- ``http``: the same through the HTTP server, with 1, 16 and 64 concurrent sessions (one local round trip per
  turn; at 16 and 64 the figure is the wall time per turn per session).

Prints, per turn range, microseconds per turn and the ratios gateway / builtin, http / builtin, and late / early
(turns at the end against turns 2-6, flat is about 1). Usage: ``python bench/gateway.py [--turns 64]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CALL = '<tool_call>\n{"name": "calc", "arguments": {"expression": "6*7"}}\n</tool_call><|im_end|>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
RESULT = "The result of the expression is 42, computed exactly."


class ReplayEngine:
    """The engine stand-in: the same tool-call ids for every prompt, at once (engine time is not measured)."""

    max_context = None

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = tuple(ids)

    async def generate(self, prompt_ids: Sequence[int], sampling: Any) -> Any:
        from verl_ext.gateway.engine import Sampled

        return Sampled(self.ids, tuple(-0.5 for _ in self.ids))


def parts(tokenizer_dir: Path) -> dict[str, Any]:
    from transformers import AutoTokenizer

    from verl_ext.core.probe import probe_template
    from verl_ext.core.rendering import ChatRenderer
    from verl_ext.gateway.parsing import ToolCallReader, reasoning_markers

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    renderer = ChatRenderer(tokenizer)
    return {
        "renderer": renderer,
        "profile": probe_template(renderer),
        "reader": ToolCallReader(tokenizer, "hermes"),
        "markers": reasoning_markers(tokenizer),
        "ids": tokenizer.encode(CALL, add_special_tokens=False),
    }


def builtin_turns(p: dict[str, Any], turns: int) -> list[float]:
    """Seconds per turn of the built-in loop's bookkeeping."""
    from verl_ext.check.inputs import EngineCall
    from verl_ext.core.trajectory import TokenTrajectory
    from verl_ext.core.turn_end import end_of_turn_ids, message_body

    end_ids = end_of_turn_ids(p["profile"])
    t = TokenTrajectory(p["renderer"], p["profile"])
    prompt = t.start([{"role": "user", "content": "What is 6*7?"}], TOOLS)
    out, calls = [], []

    async def run() -> None:  # one event loop for every turn, as the agent loop has
        nonlocal prompt
        for k in range(turns):
            started = time.perf_counter()
            calls.append(EngineCall.of(prompt, p["ids"], [-0.5] * len(p["ids"]), "stop"))
            turn = await p["reader"].read(message_body(p["ids"], end_ids), TOOLS, k, p["renderer"].decode, True)
            t.add_sampled(p["ids"], [-0.5] * len(p["ids"]), "stop", message=turn.message)
            tool = {"role": "tool", "tool_call_id": turn.calls[0].call_id, "content": RESULT}
            prompt = t.append_messages([tool])
            out.append(time.perf_counter() - started)

    asyncio.run(run())
    return out


def harness_reply(messages: list[dict[str, Any]], message: dict[str, Any]) -> list[dict[str, Any]]:
    """What a harness sends next: the reply without reasoning, arguments re-serialized, then the tool result."""
    calls = [
        {**c, "function": {**c["function"], "arguments": json.dumps(json.loads(c["function"]["arguments"]))}}
        for c in message.get("tool_calls") or ()
    ]
    assistant = {"role": "assistant", "content": message.get("content"), "tool_calls": calls}
    return [*messages, assistant, {"role": "tool", "tool_call_id": calls[0]["id"], "content": RESULT}]


def new_gateway(p: dict[str, Any], turns: int) -> Any:
    from verl_ext.gateway.service import Gateway, GatewayConfig

    config = GatewayConfig(response_length=10**9)
    return Gateway(ReplayEngine(p["ids"]), p["renderer"], p["profile"], p["reader"], config, markers=p["markers"])


def gateway_turns(p: dict[str, Any], turns: int) -> list[float]:
    """Seconds per turn of ``Gateway.complete`` in process (request parsing included)."""
    from verl_ext.gateway.request import parse_chat_request

    gateway = new_gateway(p, turns)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 6*7?"}]
    out = []

    async def run() -> None:
        nonlocal messages
        for _ in range(turns):
            body = {"messages": messages, "tools": TOOLS}
            started = time.perf_counter()
            done = await gateway.complete("s", parse_chat_request(body))
            out.append(time.perf_counter() - started)
            messages = harness_reply(messages, done.message)

    asyncio.run(run())
    assert gateway.counters["forks"] == 0, "the benchmark's harness must not fork"
    return out


def http_turns(p: dict[str, Any], turns: int, sessions: int) -> list[float]:
    """Wall seconds per turn per session through the HTTP server, ``sessions`` at once."""
    import httpx

    from verl_ext.gateway.server import ServerThread, create_app

    gateway = new_gateway(p, turns)
    server = ServerThread(create_app(gateway, "policy")).start()
    per_turn: list[list[float]] = [[] for _ in range(turns)]

    async def one(client: httpx.AsyncClient, k: int) -> None:
        messages: list[dict[str, Any]] = [{"role": "user", "content": f"What is 6*7? ({k})"}]
        for turn in range(turns):
            started = time.perf_counter()
            response = await client.post(
                f"/sessions/s{k}/v1/chat/completions", json={"messages": messages, "tools": TOOLS}
            )
            per_turn[turn].append(time.perf_counter() - started)
            messages = harness_reply(messages, response.json()["choices"][0]["message"])

    async def run() -> None:
        limits = httpx.Limits(max_connections=sessions)
        async with httpx.AsyncClient(base_url=server.url, timeout=600, limits=limits) as client:
            await asyncio.gather(*(one(client, k) for k in range(sessions)))

    try:
        asyncio.run(run())
    finally:
        server.stop()
    # concurrent sessions share one server: the time per turn per session is the round trip over the sessions
    return [statistics.median(times) / sessions for times in per_turn]


def window(values: Sequence[float], first: int, last: int) -> float:
    return statistics.median(values[first - 1 : last])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=64)
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--tokenizer", default=str(REPO / "build" / "tokenizers" / "qwen3"))
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    p = parts(Path(args.tokenizer))
    n = args.turns
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()}")
    series = {"builtin": builtin_turns(p, n), "gateway": gateway_turns(p, n)}
    for s in args.sessions:
        series[f"http x{s}"] = http_turns(p, n, s)
    early, late = (2, 6), (max(n - 4, 7), n)
    print(f"\nper-turn cost (median of the turns in range), engine excluded, {n} turns, Qwen3 tokenizer")
    print("| method | turns 2-6 us | last 5 us | late / early | / builtin (early) | / builtin (late) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    base_early, base_late = window(series["builtin"], *early), window(series["builtin"], *late)
    for name, values in series.items():
        e, l_ = window(values, *early), window(values, *late)
        ratios = f"{l_ / e:.2f} | {e / base_early:.2f} | {l_ / base_late:.2f}"
        print(f"| {name} | {e * 1e6:,.0f} | {l_ * 1e6:,.0f} | {ratios} |")
    print(f"\nload average at the end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
