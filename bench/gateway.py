"""Gateway overhead per turn, held to its goal: within 1.5x of the built-in loop's bookkeeping plus one local HTTP
round trip, at 1, 16 and 64 concurrent sessions, and flat in turns to 256.

Each conversation is a harness calling a tool turn after turn on the real Qwen3 tokenizer: the engine writes a short
reasoning block and a tool call, the harness sends the whole history back (reasoning dropped, arguments
re-serialized, as the OpenAI SDK's agents do) with the tool's result. The engine is excluded: a replay stand-in
answers every call with the same ids at once. Measured in one run, on the same conversations:

- ``loop`` (a): ``verl_ext_tool_agent``'s bookkeeping per turn: the engine call's record, the output check, the
  finish reason, ``parse_turn`` with verl's hermes parser, ``add_sampled``, the tool message, ``append_messages``;
- ``bare`` (b): one local HTTP round trip of the same stack (httpx client, uvicorn with the gateway's config,
  FastAPI) to a trivial endpoint that reads the same request body as JSON and answers a body of the gateway's
  answer's size: what any JSON endpoint costs, reading the whole history included;
- ``gateway`` (c): the gateway's round trip on the same bodies, at 1, 16 and 64 concurrent sessions;
- ``in-process``: ``parse_chat_request`` + ``Gateway.complete`` on the body already read as JSON: the gateway's
  own work, per turn.

Costs are this process's CPU time (client, server and parser threads: on a shared machine, what other processes do
counts against no method), with wall time printed beside them. Every method runs ``--reps`` times, the methods
taking turns, and each figure is the fastest repetition. Concurrent figures are the cost of the whole run divided by
the number of requests (the cost of a turn under that load). Goals, checked on CPU time at the end (``--check``:
exit 1 when one fails):

- ``gateway / (loop + bare) <= 1.5`` at each concurrency, and in each turn bucket of the long single-session run;
- flat: that ratio in turns 193-256 at most 1.25x its value in turns 9-32. A request carries the whole history, so
  reading it grows with the turns for any JSON endpoint (it is in ``bare``, whose body is the same), and the loop's
  record of each engine call holds the whole prompt (in ``loop``): a flat ratio means the gateway adds no work that
  grows faster than reading the request.

Usage: ``python bench/gateway.py [--turns 256] [--concurrent-turns 32] [--sessions 1 16 64] [--reps 3] [--check]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import Request  # the bare endpoint's annotation: FastAPI resolves it in this module's globals

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SAMPLED = (
    "<think>\nThe user wants a product; the calculator does it.\n</think>\n\n"
    '<tool_call>\n{"name": "calc", "arguments": {"expression": "6*7"}}\n</tool_call><|im_end|>'
)
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
MODEL = "policy"
GOAL_RATIO = 1.5  # gateway / (loop + bare)
FLAT_RATIO = 1.25  # gateway / (loop + bare), late turns / early turns
EARLY, LATE = (9, 32), (193, 256)
BUCKETS = ((1, 1), (2, 8), (9, 32), (33, 64), (65, 128), (129, 192), (193, 256))


class ReplayEngine:
    """The engine stand-in: the same ids for every prompt, at once (engine time is not measured)."""

    max_context = None

    def __init__(self, ids: Sequence[int]) -> None:
        self.ids = tuple(ids)
        self.log_probs = tuple(-0.5 for _ in ids)

    async def generate(self, prompt_ids: Sequence[int], sampling: Any) -> Any:
        from verl_ext.gateway.engine import Sampled

        return Sampled(self.ids, self.log_probs)


def parts(tokenizer_dir: Path) -> dict[str, Any]:
    """The tokenizer's renderer and profile, the gateway's reader, and the loop's own parser and schemas."""
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.tool_parser import ToolParser
    from verl.tools.schemas import OpenAIFunctionToolSchema

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
        "loop_parser": ToolParser.get_tool_parser("hermes", tokenizer),
        "schemas": [OpenAIFunctionToolSchema.model_validate(t) for t in TOOLS],
        "ids": tokenizer.encode(SAMPLED, add_special_tokens=False),
    }


def new_gateway(p: dict[str, Any]) -> Any:
    from verl_ext.gateway.service import Gateway, GatewayConfig

    config = GatewayConfig(response_length=10**9)
    return Gateway(ReplayEngine(p["ids"]), p["renderer"], p["profile"], p["reader"], config, markers=p["markers"])


# -- the conversations -------------------------------------------------------------------------------------------


def harness_reply(messages: list[dict[str, Any]], answer: dict[str, Any]) -> list[dict[str, Any]]:
    """What a harness sends next: the answer without reasoning, arguments re-serialized, then the tool result."""
    calls = [
        {**c, "function": {**c["function"], "arguments": json.dumps(json.loads(c["function"]["arguments"]))}}
        for c in answer.get("tool_calls") or ()
    ]
    assistant = {"role": "assistant", "content": answer.get("content"), "tool_calls": calls}
    return [*messages, assistant, {"role": "tool", "tool_call_id": calls[0]["id"], "content": RESULT}]


@dataclass(frozen=True)
class Conversation:
    """The request bodies of one session, turn by turn (as the harness sends them), and the gateway's answer."""

    histories: list[list[dict[str, Any]]]  # the messages of each request
    answer: bytes  # a gateway answer body (its size is the bare endpoint's answer)

    def bodies(self, session: int, turns: int) -> list[bytes]:
        """The first ``turns`` bodies of session ``session`` (its own first message: no two sessions send one
        body)."""
        first = {"role": "user", "content": f"What is 6*7? (session {session})"}
        return [
            json.dumps({"model": MODEL, "messages": [first, *h[1:]], "tools": TOOLS}).encode()
            for h in self.histories[:turns]
        ]


def conversation(p: dict[str, Any], turns: int) -> Conversation:
    """Run the harness against an in-process gateway once, untimed, keeping what it sent and one HTTP answer."""
    from verl_ext.gateway.request import parse_chat_request
    from verl_ext.gateway.response import completion_body

    gateway = new_gateway(p)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 6*7? (session 0)"}]
    histories, answer = [], b""

    async def run() -> None:
        nonlocal messages, answer
        for _ in range(turns):
            histories.append(messages)
            done = await gateway.complete("s", parse_chat_request({"messages": messages, "tools": TOOLS}))
            body = completion_body(done, "s", MODEL)
            answer = json.dumps(body).encode()
            messages = harness_reply(messages, body["choices"][0]["message"])

    asyncio.run(run())
    assert gateway.counters["forks"] == 0, "the benchmark's harness must not fork"
    return Conversation(histories, answer)


@dataclass(frozen=True)
class Cost:
    """Seconds of one timed span: ``cpu`` is this process's CPU time (every thread: client, server, the parser's
    executor), what the goals judge on a shared machine; ``wall`` is elapsed time."""

    cpu: float
    wall: float

    def per(self, n: int) -> Cost:
        return Cost(self.cpu / n, self.wall / n)


class Clock:
    """CPU and wall clocks started together; ``lap`` returns the cost since the last lap."""

    def __init__(self) -> None:
        self.cpu, self.wall = time.process_time(), time.perf_counter()

    def lap(self) -> Cost:
        cpu, wall = time.process_time(), time.perf_counter()
        out = Cost(cpu - self.cpu, wall - self.wall)
        self.cpu, self.wall = cpu, wall
        return out


# -- the methods -------------------------------------------------------------------------------------------------


def loop_turns(p: dict[str, Any], turns: int) -> list[Cost]:
    """Cost per turn of ``verl_ext_tool_agent``'s bookkeeping (its steps between two engine calls; turn 1 also
    renders the first prompt, as the gateway's first request does)."""
    from verl_ext.check.inputs import EngineCall
    from verl_ext.core.engine_output import validate_engine_output
    from verl_ext.core.trajectory import TokenTrajectory
    from verl_ext.core.turn_end import end_of_turn_ids, judge_finish
    from verl_ext.plugin.tool_calls import parse_turn

    renderer, profile, ids = p["renderer"], p["profile"], p["ids"]
    end_ids = end_of_turn_ids(profile)
    log_probs = [-0.5] * len(ids)
    out: list[Cost] = []

    async def run() -> None:  # one event loop for every turn, as the agent loop has
        clock = Clock()
        t = TokenTrajectory(renderer, profile)
        prompt = t.start([{"role": "user", "content": "What is 6*7?"}], TOOLS)
        for k in range(turns):
            finish = judge_finish(ids, 10**9, [], profile)
            EngineCall.of(prompt, ids, log_probs, finish.value)
            assert not validate_engine_output(ids, log_probs, renderer.vocab_size, stop_ids=profile.stop_id_set)
            turn = await parse_turn(p["loop_parser"], ids, end_ids, renderer.decode, p["schemas"], k, 1)
            t.add_sampled(ids, log_probs, finish, message=turn.message)
            tool = {"role": "tool", "tool_call_id": turn.calls[0].call_id, "content": RESULT}
            prompt = t.append_messages([tool])
            out.append(clock.lap())

    asyncio.run(run())
    return out


def in_process_turns(p: dict[str, Any], bodies: Sequence[bytes]) -> list[Cost]:
    """Cost per turn of ``parse_chat_request`` + ``Gateway.complete`` on each body read as JSON (untimed: a fresh
    object per request, as the server reads it)."""
    from verl_ext.gateway.request import parse_chat_request

    gateway = new_gateway(p)
    out: list[Cost] = []

    async def run() -> None:
        for raw in bodies:
            body = json.loads(raw)
            clock = Clock()
            await gateway.complete("s", parse_chat_request(body))
            out.append(clock.lap())

    asyncio.run(run())
    assert gateway.counters["forks"] == 0 and gateway.counters["turns"] == len(bodies)
    return out


def bare_app(answer: bytes) -> Any:
    """A trivial endpoint on the gateway's route: the body read as JSON, a fixed answer of the gateway's size."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    app = FastAPI(title="bare")
    canned = json.loads(answer)

    @app.post("/sessions/{session_id}/v1/chat/completions")
    async def chat_completions(session_id: str, request: Request) -> Any:
        body = json.loads((await request.body()).decode("utf-8"))
        if not body["messages"]:
            raise ValueError("no messages")
        return JSONResponse(canned)

    return app


@dataclass
class HttpRun:
    """One run of concurrent sessions against a server: the cost over all requests, each request's cost by turn
    (meaningful for one session: with several, a request's clock also runs for the others), and the answers
    (checked after the run, untimed)."""

    total: Cost
    by_turn: list[list[Cost]]
    answers: list[tuple[int, bytes]]


def http_run(url: str, bodies: Sequence[Sequence[bytes]], tag: str) -> HttpRun:
    """Session k sends ``bodies[k]`` in order (a request after the previous answer), all sessions at once."""
    import httpx

    turns = len(bodies[0])
    by_turn: list[list[Cost]] = [[] for _ in range(turns)]
    answers: list[tuple[int, bytes]] = []
    headers = {"content-type": "application/json"}

    async def one(client: httpx.AsyncClient, k: int) -> None:
        path = f"/sessions/{tag}-{k}/v1/chat/completions"
        for turn, body in enumerate(bodies[k]):
            clock = Clock()
            response = await client.post(path, content=body, headers=headers)
            by_turn[turn].append(clock.lap())
            answers.append((response.status_code, response.content))

    async def run() -> Cost:
        limits = httpx.Limits(max_connections=len(bodies), max_keepalive_connections=len(bodies))
        async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
            await client.post(f"/sessions/{tag}-warm/v1/chat/completions", content=bodies[0][0], headers=headers)
            clock = Clock()
            await asyncio.gather(*(one(client, k) for k in range(len(bodies))))
            return clock.lap()

    total = asyncio.run(run())
    return HttpRun(total, by_turn, answers)


def check_answers(run: HttpRun, expected_calls: Any) -> None:
    """Every answer is a 200 with the tool call the harness expects (the run measured served turns; the bare
    endpoint's canned answer is a gateway answer)."""
    for status, body in run.answers:
        if status != 200:
            raise RuntimeError(f"answered {status}: {body[:300]!r}")
        calls = json.loads(body)["choices"][0]["message"]["tool_calls"]
        if [c["function"] for c in calls] != expected_calls:
            raise RuntimeError(f"unexpected answer: {body[:300]!r}")


# -- timing and goals --------------------------------------------------------------------------------------------


def fastest_per_turn(runs: Sequence[Sequence[Cost]]) -> list[Cost]:
    """Per turn, the fastest of the repetitions (CPU and wall each)."""
    return [fastest(values) for values in zip(*runs, strict=True)]


def fastest(costs: Sequence[Cost]) -> Cost:
    return Cost(min(c.cpu for c in costs), min(c.wall for c in costs))


def bucket_mean(values: Sequence[Cost], first: int, last: int) -> Cost:
    chosen = values[first - 1 : last]
    return Cost(statistics.fmean(c.cpu for c in chosen), statistics.fmean(c.wall for c in chosen))


@dataclass(frozen=True)
class Verdict:
    goal: str
    value: float
    limit: float

    @property
    def ok(self) -> bool:
        return self.value <= self.limit

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'}  {self.goal}: {self.value:.2f} (goal <= {self.limit:g})"


def verdicts(
    concurrent: dict[int, dict[str, float]], buckets: dict[tuple[int, int], dict[str, float]]
) -> list[Verdict]:
    """The goals, from per-turn CPU seconds: ``concurrent[n]`` and ``buckets[(first, last)]`` hold ``loop``,
    ``bare`` and ``gateway`` (and buckets ``in_process``)."""
    out = [
        Verdict(f"gateway / (loop + bare), {n} sessions", f["gateway"] / (f["loop"] + f["bare"]), GOAL_RATIO)
        for n, f in sorted(concurrent.items())
    ]
    out += [
        Verdict(f"gateway / (loop + bare), turns {a}-{b}", f["gateway"] / (f["loop"] + f["bare"]), GOAL_RATIO)
        for (a, b), f in buckets.items()
    ]
    if EARLY in buckets and LATE in buckets:
        late, early = (buckets[k]["gateway"] / (buckets[k]["loop"] + buckets[k]["bare"]) for k in (LATE, EARLY))
        out.append(
            Verdict(
                f"flat: that ratio in turns {LATE[0]}-{LATE[1]} / turns {EARLY[0]}-{EARLY[1]}", late / early, FLAT_RATIO
            )
        )
    return out


def exit_status(results: Sequence[Verdict], check: bool) -> int:
    """1 when ``check`` is asked for and a goal failed, else 0."""
    return 1 if check and any(not v.ok for v in results) else 0


def _us(cost: Cost) -> str:
    return f"{cost.cpu * 1e6:,.0f} ({cost.wall * 1e6:,.0f})"


def timed(label: str, fn: Callable[[], Any]) -> Any:
    gc.collect()
    started = time.perf_counter()
    out = fn()
    print(f"  {label}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=256, help="turns of the single-session run (buckets, flatness)")
    parser.add_argument("--concurrent-turns", type=int, default=32, help="turns per session of the concurrent runs")
    parser.add_argument("--sessions", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tokenizer", default=str(REPO / "build" / "tokenizers" / "qwen3"))
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal fails")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from verl_ext.gateway.server import ServerThread, create_app

    p = parts(Path(args.tokenizer))
    n = args.turns
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()}")
    long_conv = conversation(p, max(n, args.concurrent_turns))
    expected_calls = [{"name": "calc", "arguments": '{"expression": "6*7"}'}]
    bare = ServerThread(bare_app(long_conv.answer)).start()
    gateway = new_gateway(p)
    served = ServerThread(create_app(gateway, MODEL)).start()
    long_bodies = long_conv.bodies(0, n)
    series: dict[str, list[list[Cost]]] = {"loop": [], "in_process": [], "bare": [], "gateway": []}
    totals: dict[int, dict[str, list[Cost]]] = {s: {"bare": [], "gateway": []} for s in args.sessions}
    try:
        for rep in range(args.reps):
            print(f"repetition {rep + 1}/{args.reps}", file=sys.stderr)
            series["loop"].append(timed("loop", lambda: loop_turns(p, n)))
            series["in_process"].append(timed("in process", lambda: in_process_turns(p, long_bodies)))
            for name, url in (("bare", bare.url), ("gateway", served.url)):
                tag = f"long{rep}"
                run = timed(f"{name} x1, {n} turns", lambda url=url, tag=tag: http_run(url, [long_bodies], tag))
                series[name].append([costs[0] for costs in run.by_turn])
                check_answers(run, expected_calls)
            for s in args.sessions:
                bodies = [long_conv.bodies(k, args.concurrent_turns) for k in range(s)]
                for name, url in (("bare", bare.url), ("gateway", served.url)):
                    tag = f"c{s}r{rep}"
                    run = timed(f"{name} x{s}", lambda url=url, bodies=bodies, tag=tag: http_run(url, bodies, tag))
                    totals[s][name].append(run.total.per(s * args.concurrent_turns))
                    check_answers(run, expected_calls)
    finally:
        bare.stop()
        served.stop()
    assert gateway.counters["forks"] == 0, "the benchmark's harness must not fork"

    per_turn = {name: fastest_per_turn(runs) for name, runs in series.items()}
    loop_concurrent = bucket_mean(per_turn["loop"], 1, args.concurrent_turns)
    concurrent = {s: {"loop": loop_concurrent, **{k: fastest(v) for k, v in totals[s].items()}} for s in args.sessions}
    buckets = {
        (a, b): {name: bucket_mean(values, a, b) for name, values in per_turn.items()} for a, b in BUCKETS if b <= n
    }
    print(f"\nper-turn cost, engine excluded, Qwen3 tokenizer, fastest of {args.reps} repetitions, microseconds:")
    print("CPU time of this process (client and server threads), wall time in brackets")
    print(f"\none session, {n} turns (mean per turn in each bucket)\n")
    print("| turns | loop (a) | bare HTTP (b) | gateway HTTP (c) | c - b | in-process | c / (a + b) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for (a, b), f in buckets.items():
        ratio = f["gateway"].cpu / (f["loop"].cpu + f["bare"].cpu)
        own = Cost(f["gateway"].cpu - f["bare"].cpu, f["gateway"].wall - f["bare"].wall)
        cells = [f["loop"], f["bare"], f["gateway"], own, f["in_process"]]
        print(f"| {a}-{b} | " + " | ".join(_us(c) for c in cells) + f" | {ratio:.2f} |")
    print(f"\nconcurrent sessions, {args.concurrent_turns} turns each (cost of the run / requests)\n")
    print("| sessions | loop (a) | bare HTTP (b) | gateway HTTP (c) | c / (a + b) |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for s, f in concurrent.items():
        ratio = f["gateway"].cpu / (f["loop"].cpu + f["bare"].cpu)
        print(f"| {s} | {_us(f['loop'])} | {_us(f['bare'])} | {_us(f['gateway'])} | {ratio:.2f} |")
    if EARLY in buckets and LATE in buckets:
        growth = {k: buckets[LATE][k].cpu / buckets[EARLY][k].cpu for k in ("loop", "bare", "gateway", "in_process")}
        print(
            f"\nturns {LATE[0]}-{LATE[1]} / turns {EARLY[0]}-{EARLY[1]}: "
            + ", ".join(f"{k} {v:.2f}" for k, v in growth.items())
        )
    print(f"\nload average at the end: {os.getloadavg()}\n")
    cpu = {s: {k: v.cpu for k, v in f.items()} for s, f in concurrent.items()}
    cpu_buckets = {key: {k: v.cpu for k, v in f.items()} for key, f in buckets.items()}
    results = verdicts(cpu, cpu_buckets)
    for verdict in results:
        print(verdict.line())
    return exit_status(results, args.check)


if __name__ == "__main__":
    raise SystemExit(main())
