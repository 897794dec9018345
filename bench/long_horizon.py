"""Long-horizon rollouts: per-turn bookkeeping, memory and the check at 1,000 turns (issue 30's goals).

One tool-calling rollout per template and tool-result size, driven through the one rollout object every loop and
the gateway drive (``RolloutRuntime.rollout()``: a ``LiveRollout``) as ``verl_ext_tool_agent`` drives it, the engine
and the tools excluded: per turn the budget, ``turn`` (an engine hook returning the scripted ids; the engine-call
record in the rollout's ``EngineCalls`` log, the finish judged from the ids, the output validation, ``parse_turn``
with verl's tool parser that reads the template's calls and the reader derived from the template, as the loop passes
it; where neither reads the call, the turn's message is the one its ids were rendered from), ``keep``, the tool
message, ``reply``. Then the end of the rollout: ``finish`` (the trainer sample, the ``Rollout`` the loop hands to
the check) and the check itself (template view on).

Printed, each against its goal (PASS/FAIL; never a timed test):
- flat: the mean bookkeeping per turn at turns 901-1,000 over turns 2-32 (goal at most 1.25x);
- memory: what the rollout holds at its end (the ``LiveRollout``: trajectory, engine-call records; the check's
  result; with the ``Rollout`` the check reads as a second figure), measured with tracemalloc in a second, untimed
  pass, per stream token (goal at most 64 bytes);
- check: the end-of-rollout check over one transformers render + encode of the final conversation (goal at most 1.0x),
  fastest of ``--reps`` each.

Every figure is a ratio within one run, with the machine and its load printed. Usage:
``python bench/long_horizon.py [--turns 1000] [--sizes 150,2000] [--tokenizers qwen3,gpt-oss,mistral-7b-v0.3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
import tracemalloc
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _timing import fastest  # noqa: E402
from turns import TOOLS, Conversation, _renumber, load_note, make_conversation  # noqa: E402

EARLY, LATE = range(2, 33), range(901, 1001)  # 1-based turns compared for flatness
FLAT_GOAL, BYTES_GOAL, CHECK_GOAL = 1.25, 64.0, 1.0
POOL = 8  # distinct tool results, cycled (building a 2,000-token result encodes it many times)


def long_conversation(renderer: Any, profile: Any, size: int, turns: int) -> Conversation:
    """``turns`` turns: ``POOL`` distinct tool results cycled, each turn its own call id and query."""
    base = make_conversation(renderer, profile, size, min(turns, POOL))
    conv = Conversation(base.prompt, list(base.assistants), list(base.assistant_ids), list(base.tools))
    for k in range(len(base.tools), turns):
        call = f"call{k:05d}"
        fn = {"name": "lookup", "arguments": {"query": f"q{k}"}}
        conv.assistants.append(
            {"role": "assistant", "content": "", "tool_calls": [{"id": call, "type": "function", "function": fn}]}
        )
        conv.assistant_ids.append(_renumber(renderer, base.assistant_ids[1], 1, k))
        conv.tools.append({**base.tools[k % POOL], "tool_call_id": call})
    return conv


def pick_parser(renderer: Any, profile: Any) -> Any:
    """verl's tool parser that reads this template's calls (hermes where none does)."""
    from verl.experimental.agent_loop.tool_parser import ToolParser

    from verl_ext.plugin.tool_parser_fit import tool_parser_fit

    readers = tool_parser_fit(renderer, profile).readers
    return ToolParser.get_tool_parser(readers[0] if readers else "hermes", renderer.tokenizer)


@dataclass
class Built:
    per_turn_us: list[float]
    live: Any  # the finished ``LiveRollout``
    rollout: Any  # the ``Rollout`` its ``finish`` assembled (what the check reads)

    @property
    def trajectory(self) -> Any:
        return self.live.trajectory


@dataclass(frozen=True)
class Output:
    """What an engine hook returns (``verl_ext.runtime.Generated``): the scripted turn's ids and logprobs."""

    token_ids: list[int]
    log_probs: list[float]


def runtime_for(renderer: Any) -> Any:
    """The runtime every loop shares (probe, check, policy; no records: the write is not the loop's per-turn work)."""
    from verl_ext.runtime import RolloutRuntime

    return RolloutRuntime.build(renderer)


async def build(rt: Any, conv: Conversation, turns: int, parser: Any) -> Built:
    """The rollout as ``verl_ext_tool_agent`` drives it (``_start``, ``_turn``, ``_reply``), engine and tools excluded:
    the one rollout object (``rt.rollout()``: ``start``, then per turn ``budget``, ``turn`` with an engine hook that
    returns the scripted ids and the loop's reader, ``keep``, ``reply``), then ``finish``."""
    from verl.tools.schemas import OpenAIFunctionToolSchema

    from verl_ext.core.turn_parse import parse_turn

    renderer, profile = rt.renderer, rt.profile
    schemas = [OpenAIFunctionToolSchema.model_validate(tool) for tool in TOOLS]
    stop_ids = sorted(profile.stop_id_set)
    live = rt.rollout()
    live.start(conv.prompt, TOOLS)
    budget = 10**9  # the response budget: never the limit here (the rollout ends on its scripted answer)
    k = 0

    async def read(ids: Any) -> Any:
        return await parse_turn(
            parser,
            list(ids),
            rt.end_of_turn_ids,
            renderer.decode,
            schemas,
            k,
            None,
            generation_prompt=profile.generation_prompt_ids,
            call_reader=rt.call_reader,
        )

    async def one_turn(ids: list[int], fallback: dict[str, Any]) -> Any:
        remaining = live.budget(budget)

        async def generate(max_tokens: int) -> Output:
            return Output(ids, [-0.5] * len(ids))

        turn = await live.turn(remaining, stop_ids, generate, read)
        if not turn.valid:
            raise SystemExit(f"turn {k}: the benchmark's own output is invalid: {turn.problems}")
        # no reader of this template reads the scripted call: the message the ids were rendered from
        message = turn.message if turn.parsed.calls else fallback
        live.keep(turn.call, message)
        return turn

    times: list[float] = []
    for k in range(turns):
        began = time.perf_counter_ns()
        turn = await one_turn(list(conv.assistant_ids[k]), conv.assistants[k])
        tool = dict(conv.tools[k])
        if turn.parsed.calls:  # the id the reader read (the template's own call id where it renders one)
            tool["tool_call_id"] = turn.parsed.calls[0].call_id
        live.reply([tool])
        times.append((time.perf_counter_ns() - began) / 1000)
    # The rollout ends on the assistant's answer: the template's own rendering of it, up to its close.
    final = {"role": "assistant", "content": "There are 42 crates in depot 7."}
    messages = live.trajectory.messages
    before = renderer.render(messages, TOOLS, add_generation_prompt=True).ids
    after = renderer.render([*messages, final], TOOLS).ids
    close = profile.boundary("end").close_ids
    answer = list(after[len(before) :])
    answer = answer[: answer.index(close[0]) + 1] if close else answer
    k = turns
    await one_turn(answer, final)
    finished = live.finish(response_length=None)
    return Built(times, live, finished.rollout)


def conclude(rt: Any, built: Built) -> Any:
    """The loop's end of a rollout (``LiveRollout.conclude`` without a record): the check of the ``Rollout``
    ``finish`` assembled (template view on)."""
    result = rt.checker.check_rollout(built.rollout, template_view=True)
    if not result.ok:
        raise SystemExit(f"the check found defects in a benchmark rollout: {result.summary()}")
    return result


def memory(rt: Any, conv: Conversation, turns: int, parser: Any) -> dict[str, float]:
    """Bytes per stream token: what the rollout holds at its end (the ``LiveRollout``: its trajectory with the
    per-token views, the engine-call records; the check's result), the same with the ``Rollout`` the check reads
    (trainer sample, kinds; dropped once the check has run), and the peak while it was built and checked."""
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    built = asyncio.run(build(rt, conv, turns, parser))
    result = conclude(rt, built)
    gc.collect()
    with_rollout = tracemalloc.get_traced_memory()[0]
    built.rollout = None
    gc.collect()
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    tokens = len(built.trajectory.input_ids)
    del built, result
    return {
        "tokens": tokens,
        "held_B_per_token": (held - base) / tokens,
        "with_rollout_B_per_token": (with_rollout - base) / tokens,
        "peak_B_per_token": (peak - base) / tokens,
    }


def check_ratio(rt: Any, built: Built, reps: int) -> dict[str, float]:
    messages = built.trajectory.messages
    best = fastest(
        {
            "check": lambda: conclude(rt, built),
            "hf_render": lambda: rt.renderer.tokenizer.apply_chat_template(
                [dict(m) for m in messages], tools=TOOLS, tokenize=True
            ),
        },
        reps,
        freeze=True,
    )
    return {"check_s": best["check"][0], "hf_render_s": best["hf_render"][0]}


def window(values: Sequence[float], turns: range) -> float:
    return statistics.fmean(values[k - 1] for k in turns if k <= len(values))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", type=int, default=1000)
    p.add_argument("--sizes", default="150,2000")
    p.add_argument("--tokenizers", default="qwen3,gpt-oss,mistral-7b-v0.3")
    p.add_argument("--reps", type=int, default=2, help="timed runs of the rollout and of the check; fastest kept")
    p.add_argument("--no-memory", action="store_true", help="skip the tracemalloc pass")
    p.add_argument("--no-check", action="store_true", help="skip timing the check")
    args = p.parse_args(argv)
    if args.turns < max(EARLY) + 1:
        p.error(f"--turns must be at least {max(EARLY) + 1}")
    late = range(max(args.turns - 99, max(EARLY) + 1), args.turns + 1)

    from verl_ext.core.rendering import load_renderer
    from verl_ext.demo.run import shipped_tokenizers

    print(f"machine: {load_note()}", flush=True)
    folders = shipped_tokenizers()
    rows: list[str] = []
    failed = 0
    for name in args.tokenizers.split(","):
        rt = runtime_for(load_renderer(folders[name]))
        parser = pick_parser(rt.renderer, rt.profile)
        for size in (int(s) for s in args.sizes.split(",")):
            conv = long_conversation(rt.renderer, rt.profile, size, args.turns)
            asyncio.run(build(rt, conv, 4, parser))  # learns the deltas (shared by the template's rollouts), untimed
            runs: list[Built] = []
            for _ in range(args.reps):
                gc.collect()
                runs.append(asyncio.run(build(rt, conv, args.turns, parser)))
                if len(runs) > 1:  # keep one rollout's worth: a 2,000-token rollout of today's code is GBs
                    runs[0].per_turn_us = [
                        min(a, b) for a, b in zip(runs[0].per_turn_us, runs[1].per_turn_us, strict=True)
                    ]
                    del runs[1]
            built = runs[0]
            early, lat = window(built.per_turn_us, EARLY), window(built.per_turn_us, late)
            flat = lat / early
            tokens = len(built.trajectory.input_ids)
            line = (
                f"{name:16} {size:5}-token results, {args.turns} turns, {tokens} tokens: per turn "
                f"{early / 1000:.3f} ms (turns 2-32) -> {lat / 1000:.3f} ms (turns {late.start}-{late.stop - 1}) = "
                f"{flat:.2f}x [{'PASS' if flat <= FLAT_GOAL else 'FAIL'} flat <= {FLAT_GOAL}x]"
            )
            failed += flat > FLAT_GOAL
            if not args.no_check:
                c = check_ratio(rt, built, args.reps)
                ratio = c["check_s"] / c["hf_render_s"]
                failed += ratio > CHECK_GOAL
                line += (
                    f"; check {c['check_s']:.2f} s vs transformers render {c['hf_render_s']:.2f} s = {ratio:.2f}x "
                    f"[{'PASS' if ratio <= CHECK_GOAL else 'FAIL'} <= {CHECK_GOAL}x]"
                )
            del runs, built
            if not args.no_memory:
                gc.collect()
                m = memory(rt, conv, args.turns, parser)
                failed += m["held_B_per_token"] > BYTES_GOAL
                line += (
                    f"; held {m['held_B_per_token']:.0f} B/token (with the check's Rollout "
                    f"{m['with_rollout_B_per_token']:.0f}, peak {m['peak_B_per_token']:.0f}) "
                    f"[{'PASS' if m['held_B_per_token'] <= BYTES_GOAL else 'FAIL'} <= {BYTES_GOAL:.0f}]"
                )
            print(line, flush=True)
            rows.append(line)
    print(f"machine at the end: {load_note()}")
    print("all goals met" if not failed else f"{failed} goal(s) missed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
