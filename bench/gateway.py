"""Gateway overhead per turn, held to its goal: within 1.5x of the built-in loop's bookkeeping plus one local HTTP
round trip, at 1, 16 and 64 concurrent sessions, flat in turns to 1,000, and a session's memory linear in its stream.

Each conversation is a harness calling a tool turn after turn on the real Qwen3 tokenizer: the engine writes a short
reasoning block and a tool call, the harness sends the whole history back (reasoning dropped, arguments
re-serialized, as the OpenAI SDK's agents do) with the tool's result. The engine is excluded: a replay stand-in
answers every call with the same ids at once. Measured in one run, on the same conversations:

- ``loop`` (a): ``verl_ext_tool_agent``'s bookkeeping per turn: the engine call recorded in the rollout's
  ``EngineCalls`` log (what its prompt adds), the output check, the finish reason, ``parse_turn`` with verl's hermes
  parser, ``add_sampled``, the tool message, ``append_messages``;
- ``bare`` (b): one local HTTP round trip of the same stack (httpx client, uvicorn with the gateway's config,
  FastAPI) to a trivial endpoint that reads the same request body as JSON and answers a body of the gateway's
  answer's size: what any JSON endpoint costs, reading the whole history included;
- ``gateway`` (c): the gateway's round trip on the same bodies, at 1, 16 and 64 concurrent sessions;
- ``in-process``: ``parse_chat_request`` + ``Gateway.complete`` on the body already read as JSON: the gateway's
  own work, per turn;
- memory: one session's requests served in process under tracemalloc; what the session holds (its branch's
  trajectory, messages, matching state, engine-call log) per stream token at a tenth, half and all of its turns.

Costs are this process's CPU time (client, server and parser threads: on a shared machine, what other processes do
counts against no method), with wall time printed beside them. In the single-session run the four methods take turns
at every turn (their order rotating), so that each turn's four figures are taken under the same moment's load; the
run is repeated ``--reps`` times and each turn's figure is its fastest repetition. At 1, 16 and 64 sessions, turn by
turn, the loop advances as many rollouts (as an agent-loop worker interleaves them) and each server gets every
session's request of that turn at once, the three taking turns; each figure is the cost of the fastest of
``--reps`` runs divided by its turns (the cost of a turn under that load). Goals, checked at the end (``--check``:
exit 1 when one fails):

- ``gateway / (loop + bare) <= 1.5`` (CPU time) at each concurrency, and in each turn bucket of the long
  single-session run;
- flat: that ratio in the last 10% of the turns (901-1,000 at ``--turns 1000``) at most 1.25x its value in turns
  9-32. A request carries the whole history, so reading it grows with the turns for any JSON endpoint (it is in
  ``bare``, whose body is the same): a flat ratio means the gateway adds no work that grows faster than reading the
  request;
- linear memory: the bytes per stream token a session holds at its last turn at most 1.25x half way (a session
  holding anything per turn that grows with the history would double it).

Usage: ``python bench/gateway.py [--turns 256] [--concurrent-turns 32] [--sessions 1 16 64] [--reps 5] [--check]``.
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
LINEAR_RATIO = 1.25  # bytes per stream token a session holds, at its last turn / half way
EARLY = (9, 32)  # the early turns of the flatness goal (turn 1 renders the first prompt, 2-8 warm up)


def late_bucket(turns: int) -> tuple[int, int] | None:
    """The late turns of the flatness goal: the last 10% of ``turns`` (None when they do not all come after
    ``EARLY``)."""
    first = turns - max(turns // 10, 1) + 1
    return (first, turns) if first > EARLY[1] else None


def buckets_for(turns: int) -> list[tuple[int, int]]:
    """The table's buckets of turns (first, last): 1, 2-8, 9-32, then doubling (33-64, 65-128, ...) up to the late
    bucket, then the late bucket (the last 10%): 1,000 turns give ..., 257-512, 513-900, 901-1,000."""
    late = late_bucket(turns)
    end = turns if late is None else late[0] - 1
    out = [(a, min(b, end)) for a, b in ((1, 1), (2, 8), EARLY) if a <= end]
    first = EARLY[1] + 1
    while first <= end:
        last = min(2 * (first - 1), end)
        out.append((first, last))
        first = last + 1
    return out if late is None else [*out, late]


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

    from verl_ext.core.rendering import ChatRenderer
    from verl_ext.gateway.parsing import ToolCallReader, reasoning_markers
    from verl_ext.runtime import RolloutRuntime

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    renderer = ChatRenderer(tokenizer)
    return {
        "renderer": renderer,
        "runtime": RolloutRuntime.build(renderer),  # the loop's (the gateways build their own, as a process does)
        "reader": ToolCallReader(tokenizer, "hermes"),
        "markers": reasoning_markers(tokenizer),
        "loop_parser": ToolParser.get_tool_parser("hermes", tokenizer),
        "schemas": [OpenAIFunctionToolSchema.model_validate(t) for t in TOOLS],
        "ids": tokenizer.encode(SAMPLED, add_special_tokens=False),
    }


def new_gateway(p: dict[str, Any]) -> Any:
    from verl_ext.gateway.service import Gateway, GatewayConfig
    from verl_ext.runtime import RolloutRuntime

    config = GatewayConfig(response_length=10**9)
    runtime = RolloutRuntime.build(p["renderer"])
    return Gateway(ReplayEngine(p["ids"]), runtime, p["reader"], config, markers=p["markers"])


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


class LoopTurns:
    """``verl_ext_tool_agent``'s bookkeeping, turn by turn (its steps between two engine calls; turn 1 also renders
    the first prompt, as the gateway's first request does): the engine call recorded in the rollout's
    ``EngineCalls`` log (``RolloutRuntime.engine_call``: what the prompt adds), the output check, ``parse_turn``, the
    turn kept as sampled, the tool message appended."""

    def __init__(self, p: dict[str, Any]) -> None:
        from verl_ext.check.inputs import EngineCalls

        self.p = p
        self.runtime = p["runtime"]
        self.log_probs = [-0.5] * len(p["ids"])
        self.calls = EngineCalls()
        self.trajectory: Any = None
        self.prompt: Any = None

    async def turn(self, k: int) -> Cost:
        from verl_ext.plugin.tool_calls import parse_turn
        from verl_ext.runtime import keep_sampled

        p, ids, log_probs, runtime = self.p, self.p["ids"], self.log_probs, self.runtime
        clock = Clock()
        if self.trajectory is None:
            self.trajectory = runtime.new_trajectory()
            self.prompt = self.trajectory.start([{"role": "user", "content": "What is 6*7?"}], TOOLS)
        call, _ = runtime.engine_call(self.calls, self.prompt, ids, log_probs, 10**9, [])
        assert not runtime.output_problems(call.output_ids, call.logprobs)
        gen = runtime.profile.generation_prompt_ids
        turn = await parse_turn(
            p["loop_parser"],
            call.output_ids,
            runtime.end_of_turn_ids,
            runtime.renderer.decode,
            p["schemas"],
            k,
            1,
            generation_prompt=gen,
            call_reader=runtime.call_reader,
        )
        self.calls.append(call)
        keep_sampled(self.trajectory, call, turn.message)
        tool = {"role": "tool", "tool_call_id": turn.calls[0].call_id, "content": RESULT}
        self.prompt = self.trajectory.append_messages([tool])
        return clock.lap()


METHODS = ("loop", "in_process", "bare", "gateway")


def long_run(p: dict[str, Any], bodies: Sequence[bytes], urls: dict[str, str], tag: str) -> tuple[dict, list]:
    """One session's turns with the four methods taking turns at every turn, their order rotating, so that each
    turn's figures are taken under the same moment's load: the loop's bookkeeping, ``Gateway.complete`` in process
    on the body read as JSON (untimed: a fresh object per request, as the server reads it), and the request over
    HTTP to the bare endpoint and to the gateway. Returns the costs per method and the HTTP answers."""
    import httpx

    from verl_ext.gateway.request import parse_chat_request

    loop, gateway = LoopTurns(p), new_gateway(p)
    out: dict[str, list[Cost]] = {name: [] for name in METHODS}
    answers: list[tuple[int, bytes]] = []
    headers = {"content-type": "application/json"}

    async def run() -> None:
        async with httpx.AsyncClient(timeout=600) as client:
            for name in ("bare", "gateway"):  # connections open before the timing
                await client.post(
                    f"{urls[name]}/sessions/{tag}-warm/v1/chat/completions", content=bodies[0], headers=headers
                )
            for k, raw in enumerate(bodies):
                for name in METHODS[k % 4 :] + METHODS[: k % 4]:
                    if name == "loop":
                        cost = await loop.turn(k)
                    elif name == "in_process":
                        body = json.loads(raw)
                        clock = Clock()
                        await gateway.complete("s", parse_chat_request(body))
                        cost = clock.lap()
                    else:
                        clock = Clock()
                        response = await client.post(
                            f"{urls[name]}/sessions/{tag}/v1/chat/completions", content=raw, headers=headers
                        )
                        cost = clock.lap()
                        answers.append((response.status_code, response.content))
                    out[name].append(cost)

    asyncio.run(run())
    assert gateway.counters["forks"] == 0 and gateway.counters["turns"] == len(bodies)
    return out, answers


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


def concurrent_run(
    p: dict[str, Any], bodies: Sequence[Sequence[bytes]], urls: dict[str, str], tag: str
) -> tuple[dict[str, Cost], list[tuple[int, bytes]]]:
    """``len(bodies)`` sessions at once, turn by turn: at each turn the loop advances as many rollouts (as an
    agent-loop worker interleaves them), and each server gets every session's request of that turn at once; the
    three take turns at every turn, their order rotating. Returns each method's cost over the run, and the answers."""
    import httpx

    sessions, turns = len(bodies), len(bodies[0])
    loops = [LoopTurns(p) for _ in range(sessions)]
    costs = {name: Cost(0.0, 0.0) for name in ("loop", "bare", "gateway")}
    answers: list[tuple[int, bytes]] = []
    headers = {"content-type": "application/json"}

    async def post(client: httpx.AsyncClient, name: str, k: int, turn: int) -> None:
        url = f"{urls[name]}/sessions/{tag}-{k}/v1/chat/completions"
        response = await client.post(url, content=bodies[k][turn], headers=headers)
        answers.append((response.status_code, response.content))

    async def run() -> None:
        limits = httpx.Limits(max_connections=2 * sessions, max_keepalive_connections=2 * sessions)
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            for name in ("bare", "gateway"):  # connections open before the timing, one session each
                warm = [f"{urls[name]}/sessions/{tag}-warm{k}/v1/chat/completions" for k in range(sessions)]
                await asyncio.gather(*(client.post(url, content=bodies[0][0], headers=headers) for url in warm))
            for turn in range(turns):
                names = list(costs)
                for name in names[turn % 3 :] + names[: turn % 3]:
                    clock = Clock()
                    if name == "loop":
                        for loop in loops:
                            await loop.turn(turn)
                    else:
                        await asyncio.gather(*(post(client, name, k, turn) for k in range(sessions)))
                    lap = clock.lap()
                    costs[name] = Cost(costs[name].cpu + lap.cpu, costs[name].wall + lap.wall)

    asyncio.run(run())
    return costs, answers


@dataclass(frozen=True)
class Held:
    """What one session holds after ``turn`` turns (tracemalloc: bytes allocated since the session began and still
    alive), and its stream's length."""

    turn: int
    bytes: int
    tokens: int

    @property
    def per_token(self) -> float:
        return self.bytes / self.tokens


def session_memory(p: dict[str, Any], bodies: Sequence[bytes]) -> tuple[list[Held], list[tuple[str, int]]]:
    """One session's requests served in process, under tracemalloc: what the session holds at a tenth, half and all
    of its turns (its branch, messages, matching state, engine-call log; each request's body is read and dropped, as
    the server does), and the allocation sites of what it holds at the end (bytes by file). The process-wide caches
    are warmed first by another session's first turns, so what is counted is the session's own."""
    import tracemalloc

    from verl_ext.gateway.request import parse_chat_request

    gateway = new_gateway(p)
    n = len(bodies)
    marks = sorted({max(n // 10, 1), max(n // 2, 1), n})
    held: list[Held] = []
    sites: list[tuple[str, int]] = []

    async def serve(session: str, raw: bytes) -> None:
        await gateway.complete(session, parse_chat_request(json.loads(raw)))

    async def run() -> None:
        nonlocal sites
        for raw in bodies[:3]:
            await serve("warm", raw)
        gc.collect()
        tracemalloc.start(1)
        try:
            base, start = tracemalloc.take_snapshot(), tracemalloc.get_traced_memory()[0]
            for k, raw in enumerate(bodies, 1):
                await serve("s", raw)
                if k in marks:
                    gc.collect()
                    tokens = len(gateway.sessions["s"].branches[0].trajectory.input_ids)
                    held.append(Held(k, tracemalloc.get_traced_memory()[0] - start, tokens))
            by_file = tracemalloc.take_snapshot().compare_to(base, "filename")
            sites = [(stat.traceback[0].filename, stat.size_diff) for stat in by_file if stat.size_diff > 0][:8]
        finally:
            tracemalloc.stop()

    asyncio.run(run())
    assert len(gateway.sessions["s"].branches) == 1, "the benchmark's harness must not fork"
    return held, sites


def check_answers(answers: Sequence[tuple[int, bytes]], expected_calls: Any) -> None:
    """Every answer is a 200 with the tool call the harness expects (the run measured served turns; the bare
    endpoint's canned answer is a gateway answer)."""
    for status, body in answers:
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
    concurrent: dict[int, dict[str, float]],
    buckets: dict[tuple[int, int], dict[str, float]],
    late: tuple[int, int] | None,
    memory: Sequence[Held] = (),
) -> list[Verdict]:
    """The goals, from per-turn CPU seconds: ``concurrent[n]`` and ``buckets[(first, last)]`` hold ``loop``,
    ``bare`` and ``gateway`` (and buckets ``in_process``); flat: bucket ``late`` against ``EARLY``; linear memory:
    the bytes per stream token a session holds at its last turn against half way (``memory``, in turn order)."""
    out = [
        Verdict(f"gateway / (loop + bare), {n} sessions", f["gateway"] / (f["loop"] + f["bare"]), GOAL_RATIO)
        for n, f in sorted(concurrent.items())
    ]
    out += [
        Verdict(f"gateway / (loop + bare), turns {a}-{b}", f["gateway"] / (f["loop"] + f["bare"]), GOAL_RATIO)
        for (a, b), f in buckets.items()
    ]
    if late is not None and EARLY in buckets and late in buckets:
        end, early = (buckets[k]["gateway"] / (buckets[k]["loop"] + buckets[k]["bare"]) for k in (late, EARLY))
        goal = f"flat: that ratio in turns {late[0]}-{late[1]} / turns {EARLY[0]}-{EARLY[1]}"
        out.append(Verdict(goal, end / early, FLAT_RATIO))
    if len(memory) >= 2:
        half, last = memory[-2], memory[-1]
        goal = f"linear memory: bytes per stream token a session holds at turn {last.turn} / at turn {half.turn}"
        out.append(Verdict(goal, last.per_token / half.per_token, LINEAR_RATIO))
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
    parser.add_argument("--reps", type=int, default=5)
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
    totals: dict[int, dict[str, list[Cost]]] = {s: {"loop": [], "bare": [], "gateway": []} for s in args.sessions}
    urls = {"bare": bare.url, "gateway": served.url}
    try:
        for rep in range(args.reps):
            print(f"repetition {rep + 1}/{args.reps}", file=sys.stderr)
            tag = f"long{rep}"
            costs, answers = timed(f"one session, {n} turns", lambda tag=tag: long_run(p, long_bodies, urls, tag))
            for name, values in costs.items():
                series[name].append(values)
            check_answers(answers, expected_calls)
            for s in args.sessions:
                bodies = [long_conv.bodies(k, args.concurrent_turns) for k in range(s)]
                tag = f"c{s}r{rep}"
                run = timed(f"{s} sessions", lambda bodies=bodies, tag=tag: concurrent_run(p, bodies, urls, tag))
                check_answers(run[1], expected_calls)
                for name, cost in run[0].items():
                    totals[s][name].append(cost.per(s * args.concurrent_turns))
    finally:
        bare.stop()
        served.stop()
    assert gateway.counters["forks"] == 0, "the benchmark's harness must not fork"
    memory, sites = timed(f"one session's memory, {n} turns", lambda: session_memory(p, long_bodies))

    per_turn = {name: fastest_per_turn(runs) for name, runs in series.items()}
    concurrent = {s: {k: fastest(v) for k, v in totals[s].items()} for s in args.sessions}
    buckets = {
        (a, b): {name: bucket_mean(values, a, b) for name, values in per_turn.items()} for a, b in buckets_for(n)
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
    late = late_bucket(n)
    if late is not None and EARLY in buckets:
        growth = {k: buckets[late][k].cpu / buckets[EARLY][k].cpu for k in ("loop", "bare", "gateway", "in_process")}
        print(
            f"\nturns {late[0]}-{late[1]} / turns {EARLY[0]}-{EARLY[1]}: "
            + ", ".join(f"{k} {v:.2f}" for k, v in growth.items())
        )
    print("\nwhat one session holds (tracemalloc, in process)\n")
    print("| turns | stream tokens | held bytes | bytes per token |")
    print("| ---: | ---: | ---: | ---: |")
    for h in memory:
        print(f"| {h.turn:,} | {h.tokens:,} | {h.bytes:,} | {h.per_token:.1f} |")
    root = str(REPO) + os.sep
    print(
        "\nheld at the end, by the file that allocated it: "
        + ", ".join(f"{path.replace(root, '')} {size / memory[-1].tokens:.1f}" for path, size in sites)
        + " (bytes per token)"
    )
    print(f"\nload average at the end: {os.getloadavg()}\n")
    cpu = {s: {k: v.cpu for k, v in f.items()} for s, f in concurrent.items()}
    cpu_buckets = {key: {k: v.cpu for k, v in f.items()} for key, f in buckets.items()}
    results = verdicts(cpu, cpu_buckets, late, memory)
    for verdict in results:
        print(verdict.line())
    return exit_status(results, args.check)


if __name__ == "__main__":
    raise SystemExit(main())
