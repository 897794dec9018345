"""Per-turn token bookkeeping: verl_ext against verl 0.9.1's Continuous Token builder, a full re-render, the floor.

On the same conversations (an assistant tool call, then a tool result of about 10, 200 or 2,000 tokens, for 1 to
256 turns), each method builds the next engine prompt after every turn:

- ``verl_ext``: ``TokenTrajectory.add_sampled`` + ``append_messages`` (learned context deltas);
- ``verl_ct``: verl 0.9.1's builder exactly as its ``ToolAgentLoop`` calls it (``merge_assistant_tokens`` +
  ``align_response_metadata``, then ``merge_context_tokens`` + ``align_response_metadata``), for every shipped
  tokenizer that verl has a model-specific builder for;
- ``rerender``: the whole conversation rendered and encoded again (TRL's earlier way), at sampled turns;
- ``floor``: encoding the new tool result's text once.

Before timing anything it checks that every method yields the same prompt ids. It also times verl_ext's
end-of-rollout check against one full render of the final conversation. Engine time is excluded throughout.

Every figure is read as a ratio to a baseline measured in the same run: the methods take turns within each run
(verl_ext, the floor, verl's builder, then the next run), and each turn's time is the fastest of the runs, so a
moment when other processes hold the CPU counts against no method in particular. Each timed run follows 8 untimed
turns of the same method, and the set-up objects are frozen out of the garbage collector while methods are timed.
The performance goals are checked at the end (flat: turns 60-64 at most 1.2x turns 2-6; at most 0.5x verl's
builder; at most 2x the floor from 200 tokens; the check at most 1x one render). Prints the tables, writes
build/bench/turns.{md,json} and the growth curves build/bench/turns.png.
Usage: ``python bench/turns.py [--turns 256] [--reps 3] [--out build/bench]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _timing import fastest  # noqa: E402

SIZES = (10, 200, 2000)
EARLY, LATE = range(2, 7), range(60, 65)  # turns averaged for the table (1-based)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a record up in the inventory database and return it as JSON lines.",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string", "description": "what to look up"}},
                "required": ["query"],
            },
        },
    }
]
SYSTEM = "You are an inventory agent. Use the lookup tool, then answer briefly."
_WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "widget",
    "bolt",
    "crate",
    "pallet",
    "north",
    "south",
    "depot",
    "item",
    "stock",
    "price",
]


def tool_output(tokenizer: Any, n_tokens: int, rng: random.Random) -> str:
    """JSON lines (braces, quotes, numbers, newlines: edges where BPE merges) of about ``n_tokens`` tokens."""
    parts: list[str] = []
    text = ""
    while len(tokenizer.encode(text, add_special_tokens=False)) < n_tokens:
        if n_tokens <= 16:  # a short result: a number and words
            parts.append(rng.choice(_WORDS) if parts else str(rng.randint(0, 500)))
            text = " ".join(parts)
        else:
            row = {"id": rng.randint(1, 99999), "name": " ".join(rng.sample(_WORDS, 2)), "qty": rng.randint(0, 500)}
            parts.append(json.dumps(row))
            text = "\n".join(parts)
    return text


@dataclass
class Conversation:
    prompt: list[dict[str, Any]]
    assistants: list[dict[str, Any]]  # assistant tool-call messages, one per turn
    assistant_ids: list[list[int]]  # what the engine sampled for each (the template's own rendering of it)
    tools: list[dict[str, Any]]  # tool results, one per turn

    @property
    def turns(self) -> int:
        return len(self.tools)

    def messages(self, turns: int) -> list[dict[str, Any]]:
        out = list(self.prompt)
        for k in range(turns):
            out += [self.assistants[k], self.tools[k]]
        return out


def make_conversation(renderer: Any, profile: Any, size: int, turns: int, seed: int = 0) -> Conversation:
    user = {"role": "user", "content": "How many crates are in depot 7?"}
    try:
        return _conversation(renderer, profile, [{"role": "system", "content": SYSTEM}, user], size, turns, seed)
    except NotPrefixPreserving:  # Mistral's templates fold the system prompt into the last user message only
        return _conversation(renderer, profile, [user], size, turns, seed)


class NotPrefixPreserving(Exception):
    pass


def _conversation(
    renderer: Any, profile: Any, prompt: list[dict[str, Any]], size: int, turns: int, seed: int
) -> Conversation:
    rng = random.Random(f"{seed}-{size}")
    tok = renderer.tokenizer
    close = profile.boundary("tool").close_ids[0]
    conv = Conversation(prompt, [], [], [])
    history = list(prompt)
    for k in range(turns):
        call_id = f"call{k:05d}"  # 9 alphanumerics: Mistral's templates require exactly that
        assistant = {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "lookup", "arguments": {"query": f"q{k}"}}}
            ],
        }
        tool = {"role": "tool", "content": tool_output(tok, size, rng), "tool_call_id": call_id, "name": "lookup"}
        if k < 2:  # the assistant's ids do not depend on the turn: derive them from a short history only
            before = renderer.render(history, TOOLS, add_generation_prompt=True).ids
            after = renderer.render([*history, assistant, tool], TOOLS, add_generation_prompt=True).ids
            if after[: len(before)] != before:
                raise NotPrefixPreserving(renderer.name)
            rest = after[len(before) :]
            sampled = list(rest[: rest.index(close) + 1])
            history += [assistant, tool]
        else:
            sampled = _renumber(renderer, conv.assistant_ids[1], 1, k)
        conv.assistants.append(assistant)
        conv.assistant_ids.append(sampled)
        conv.tools.append(tool)
    return conv


def _renumber(renderer: Any, ids: list[int], old: int, new: int) -> list[int]:
    text = renderer.decode(ids).replace(f'"q{old}"', f'"q{new}"').replace(f"call{old:05d}", f"call{new:05d}")
    return renderer.encode(text)


# -- methods ----------------------------------------------------------------------------------------
@dataclass
class Run:
    per_turn_us: list[float]
    prompts: dict[int, list[int]] = field(default_factory=dict)  # turn (1-based) -> prompt after it
    extra: dict[str, Any] = field(default_factory=dict)


def run_verl_ext(renderer: Any, profile: Any, conv: Conversation, turns: int, keep: set[int], deltas: Any) -> Run:
    from verl_ext.core.trajectory import TokenTrajectory

    t = TokenTrajectory(renderer, profile, deltas=deltas)
    t.start(conv.prompt, TOOLS)
    times: list[float] = []
    prompts: dict[int, list[int]] = {}
    for k in range(turns):
        ids = conv.assistant_ids[k]
        logprobs = [-0.5] * len(ids)
        began = time.perf_counter_ns()
        t.add_sampled(ids, logprobs, "stop", message=conv.assistants[k])
        prompt = t.append_messages([conv.tools[k]])
        times.append((time.perf_counter_ns() - began) / 1000)
        if k + 1 in keep:
            prompts[k + 1] = prompt[:]  # a list copy, outside the timing (the prompt is a view of the stream)
    return Run(times, prompts, {"trajectory": t})


def run_verl_ct(builder: Any, conv: Conversation, turns: int, keep: set[int]) -> Run:
    messages = [dict(m) for m in conv.prompt]
    prompt_ids = builder.build_initial_tokens(messages, tools=TOOLS)
    mask: list[int] = []
    logprobs: list[float] = []
    times: list[float] = []
    prompts: dict[int, list[int]] = {}
    for k in range(turns):
        ids = conv.assistant_ids[k]
        lps = [-0.5] * len(ids)
        began = time.perf_counter_ns()
        merge = builder.merge_assistant_tokens(prompt_ids, ids)
        mask, logprobs = builder.align_response_metadata(merge, mask, logprobs, assistant_logprobs=lps)
        prompt_ids = merge.token_ids
        messages.append(conv.assistants[k])
        previous = list(messages)
        messages.append(conv.tools[k])
        merge = builder.merge_context_tokens(previous, messages, prompt_ids, tools=TOOLS)
        mask, logprobs = builder.align_response_metadata(merge, mask, logprobs)
        prompt_ids = merge.token_ids
        times.append((time.perf_counter_ns() - began) / 1000)
        if k + 1 in keep:
            prompts[k + 1] = prompt_ids
    return Run(times, prompts)


def run_floor(renderer: Any, conv: Conversation, turns: int) -> Run:
    times = []
    for k in range(turns):
        text = conv.tools[k]["content"]
        began = time.perf_counter_ns()
        renderer.encode(text)
        times.append((time.perf_counter_ns() - began) / 1000)
    return Run(times)


def run_rerender(renderer: Any, conv: Conversation, at: Sequence[int]) -> Run:
    """The whole conversation rendered and encoded after turn k, for each k in ``at`` (NaN elsewhere)."""
    times = [float("nan")] * max(at)
    prompts = {}
    for k in at:
        messages = conv.messages(k)
        began = time.perf_counter_ns()
        ids = renderer.tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=True)
        times[k - 1] = (time.perf_counter_ns() - began) / 1000
        prompts[k] = list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
    return Run(times, prompts)


WARM_UP_TURNS = 8  # untimed turns of a method just before each of its timed runs
CHECK_REPS = 5  # runs of the check and of each render it is compared with


def fastest_runs(makers: dict[str, Callable[[int], Run]], turns: int, reps: int) -> dict[str, Run]:
    """Each method run ``reps`` times over ``turns`` turns, the methods taking turns within each repetition; per
    turn, the fastest. Before each timed run, the method runs ``WARM_UP_TURNS`` untimed turns (its code and data
    back in the CPU's caches after the other method's run), and the objects that exist before the timing (the
    conversations: ~342k objects for Mistral) are frozen out of the garbage collector: a collection that walks
    them inside a timed turn flushed the caches and made the floor 10-22% faster on late turns than early ones."""
    runs: dict[str, list[Run]] = {name: [] for name in makers}
    gc.collect()
    gc.freeze()
    try:
        for _ in range(reps):
            for name, make in makers.items():
                gc.collect()  # this run's garbage from the last one (the frozen objects are not walked)
                make(min(turns, WARM_UP_TURNS))
                runs[name].append(make(turns))
    finally:
        gc.unfreeze()
    out = {}
    for name, rs in runs.items():
        merged = [min(r.per_turn_us[i] for r in rs) for i in range(len(rs[0].per_turn_us))]
        out[name] = Run(merged, rs[-1].prompts, rs[-1].extra)
    return out


def load_note() -> str:
    """The machine and its load now (this benchmark shares it with whatever else runs)."""
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{platform.machine()}, {os.cpu_count()} CPUs, load average {load}"


def check_seconds(renderer: Any, profile: Any, conv: Conversation, turns: int, deltas: Any) -> dict[str, float]:
    """verl_ext's end-of-rollout check on a ``turns``-turn rollout, against one full render of its messages: as
    transformers does it (``apply_chat_template(..., tokenize=True)``) and as ``ChatRenderer.render`` does it (the
    render inside the check). Wall and CPU seconds (``time.process_time``: every thread), fastest of ``CHECK_REPS``
    each, with the set-up objects frozen out of the garbage collector as in ``fastest_runs``."""
    from verl_ext.check import ConsistencyChecker
    from verl_ext.check.inputs import EngineCall, trainer_sample_from_trajectory
    from verl_ext.core.trajectory import TokenTrajectory

    t = TokenTrajectory(renderer, profile, deltas=deltas)
    prompt = t.start(conv.prompt, TOOLS)
    calls = []
    for k in range(turns):
        ids = conv.assistant_ids[k]
        calls.append(EngineCall.of(prompt, ids, [-0.5] * len(ids), "stop"))
        t.add_sampled(ids, [-0.5] * len(ids), "stop", message=conv.assistants[k])
        prompt = t.append_messages([conv.tools[k]])
    # A rollout ends on the assistant's answer: the template's own rendering of it, up to its close.
    final = {"role": "assistant", "content": "There are 42 crates in depot 7."}
    before = renderer.render(t.messages, TOOLS, add_generation_prompt=True).ids
    after = renderer.render([*t.messages, final], TOOLS).ids
    close = profile.boundary("end").close_ids
    answer = list(after[len(before) :])
    answer = answer[: answer.index(close[0]) + 1] if close else answer
    calls.append(EngineCall.of(prompt, answer, [-0.5] * len(answer), "stop"))
    t.add_sampled(answer, [-0.5] * len(answer), "stop", message=final)
    t.finish()
    sample = trainer_sample_from_trajectory(t)
    checker = ConsistencyChecker(renderer, profile)
    messages = t.messages
    results = []
    methods: dict[str, Callable[[], object]] = {
        "check": lambda: results.append(
            checker.check(calls, sample, messages, TOOLS, template_view=True, prompt_messages=len(conv.prompt))
        ),
        # One full render as transformers does it: what a user pays for "one full render".
        "hf_render": lambda: renderer.tokenizer.apply_chat_template(
            [dict(m) for m in messages], tools=TOOLS, tokenize=True
        ),
        "render": lambda: renderer.render(messages, TOOLS),  # verl_ext's, the one inside the check
    }
    best = fastest(methods, CHECK_REPS, freeze=True)  # as in fastest_runs: set-up objects frozen
    result = results[-1]
    if not result.ok:
        raise SystemExit(f"the check found defects in a benchmark rollout: {result.summary()}")
    return {
        "check_s": best["check"][0],
        "render_s": best["render"][0],
        "hf_render_s": best["hf_render"][0],
        "check_cpu_s": best["check"][1],
        "render_cpu_s": best["render"][1],
        "hf_render_cpu_s": best["hf_render"][1],
        "tokens": len(t.input_ids),
    }


# -- reporting --------------------------------------------------------------------------------------
def window_mean(values: Sequence[float], window: range) -> float:
    picked = [values[k - 1] for k in window if k - 1 < len(values)]
    return statistics.fmean(picked) if picked else float("nan")


def fmt(x: float, digits: int = 0) -> str:
    return "-" if x != x else f"{x:,.{digits}f}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=256)
    parser.add_argument("--reps", type=int, default=3, help="runs per method; the fastest run per turn is reported")
    parser.add_argument("--out", default=str(REPO / "build" / "bench"))
    parser.add_argument("--tokenizers", default="qwen3,qwen2.5,gpt-oss,mistral-7b-v0.3")
    args = parser.parse_args(argv)
    if not 1 <= args.turns <= 4096:
        parser.error("--turns must be within 1..4096")

    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    from verl_ext.core.learned_deltas import LearnedDeltas
    from verl_ext.core.probe import probe_template
    from verl_ext.core.rendering import load_renderer
    from verl_ext.demo.run import shipped_tokenizers

    folders = shipped_tokenizers()
    # verl picks its builder from config.json's model_type; these are the shipped tokenizers' model types.
    model_types = {"qwen3": "qwen3", "qwen2.5": "qwen2", "gpt-oss": "gpt_oss", "mistral-7b-v0.3": "mistral"}
    specific = {"qwen3", "qwen2", "gpt_oss"}  # model types with a model-specific builder in verl 0.9.1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    turns = args.turns
    growth = sorted({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024} & set(range(1, turns + 1)) | {turns})
    rerender_at = sorted(set(growth) | {k for k in (*EARLY, *LATE) if k <= turns})
    results: list[dict[str, Any]] = []
    curves: dict[tuple[str, int], dict[str, list[float]]] = {}
    started = time.monotonic()
    started_note = load_note()
    print(f"machine: {started_note}", flush=True)
    for name in args.tokenizers.split(","):
        renderer = load_renderer(folders[name])
        profile = probe_template(renderer)
        model_type = model_types[name]
        builder = (
            create_continuous_token_builder(renderer.tokenizer, hf_model_type=model_type)
            if model_type in specific
            else None
        )
        for size in SIZES:
            say = f"[{time.monotonic() - started:6.1f}s] {name}, tool outputs of {size} tokens"
            print(f"{say}: building {turns} turns", flush=True)
            conv = make_conversation(renderer, profile, size, turns)
            deltas = LearnedDeltas(renderer, profile)
            began = time.perf_counter()
            ours = run_verl_ext(renderer, profile, conv, min(turns, 2), set(), deltas)  # learns the shape
            learn_ms = (time.perf_counter() - began) * 1000
            keep = set(rerender_at)
            makers: dict[str, Callable[[int], Run]] = {  # each takes the number of turns to run
                "verl_ext": partial(run_verl_ext, renderer, profile, conv, keep=keep, deltas=deltas),
                "floor": partial(run_floor, renderer, conv),
            }
            if builder:
                makers["verl_ct"] = partial(run_verl_ct, builder, conv, keep=keep)
            timed = fastest_runs(makers, turns, args.reps)
            ours, floor, verl = timed["verl_ext"], timed["floor"], timed.get("verl_ct")
            print(f"{say}: re-rendering at {len(rerender_at)} turn counts", flush=True)
            rerender = run_rerender(renderer, conv, rerender_at)
            # Identical prompt ids, or no figure at all.
            for k in rerender_at:
                if ours.prompts[k] != rerender.prompts[k]:
                    raise SystemExit(f"{name}/{size}: verl_ext's prompt after turn {k} differs from a full render")
                if verl and verl.prompts[k] != ours.prompts[k]:
                    raise SystemExit(f"{name}/{size}: verl's builder's prompt after turn {k} differs from verl_ext's")
            stats = deltas.stats
            if stats.unverifiable:
                raise SystemExit(f"{name}/{size}: a learned delta was unverifiable ({stats}); the numbers would lie")
            check_turns = min(turns, 64)
            check = check_seconds(renderer, profile, conv, check_turns, deltas)
            row: dict[str, Any] = {
                "tokenizer": name,
                "size": size,
                "learn_ms": learn_ms,
                "check_turns": check_turns,
                **check,
                "verl_ext_total_s": sum(ours.per_turn_us[:check_turns]) / 1e6,
            }
            for label, window in (("early", EARLY), ("late", LATE), ("last", range(max(1, turns - 4), turns + 1))):
                row[f"verl_ext_{label}"] = window_mean(ours.per_turn_us, window)
                row[f"floor_{label}"] = window_mean(floor.per_turn_us, window)
                row[f"verl_ct_{label}"] = window_mean(verl.per_turn_us, window) if verl else float("nan")
                row[f"rerender_{label}"] = window_mean(rerender.per_turn_us, window)
            results.append(row)
            curves[(name, size)] = {
                "verl_ext": ours.per_turn_us,
                "floor": floor.per_turn_us,
                **({"verl_ct": verl.per_turn_us} if verl else {}),
                "rerender": rerender.per_turn_us,
            }
            print(f"{say}: done (verl_ext {fmt(row['verl_ext_late'])} µs/turn at turns 60-64)", flush=True)

    notes = (started_note, load_note())
    table = render_table(results, turns, args.reps, notes)
    print("\n" + table)
    (out / "turns.md").write_text(table + "\n", encoding="utf-8")
    (out / "turns.json").write_text(
        json.dumps({"turns": turns, "reps": args.reps, "machine": notes, "results": results}, indent=1),
        encoding="utf-8",
    )
    draw(curves, out / "turns.png")
    print(f"\nwrote {out / 'turns.md'}, {out / 'turns.json'} and {out / 'turns.png'}")
    return 0


def render_table(results: Sequence[dict[str, Any]], turns: int, reps: int, notes: Sequence[str] = ()) -> str:
    last = f"{max(1, turns - 4)}-{turns}"
    windows = [("early", "2-6"), ("late", "60-64")] + ([("last", last)] if turns > max(LATE) else [])
    lines = [
        f"Per-turn cost of appending an assistant tool call and a tool result (engine excluded): fastest of {reps} "
        f"runs per turn (each after {WARM_UP_TURNS} untimed turns), the methods taking turns within each run; mean "
        "over turns 2-6 (early), 60-64 (late)"
        + (f" and {last} (last)" if turns > max(LATE) else "")
        + ". Ratios are to baselines measured in the same run: verl 0.9.1's Continuous Token builder (CT), the "
        "floor (encoding the new tool result once) and verl_ext's own early turns.",
        "",
        *(f"Machine and load: at the start {notes[0]}; at the end {notes[1]}." for _ in notes[1:2]),
        "",
        "| tokenizer | tool output | turns | verl_ext / CT | verl_ext / floor | late / early | verl_ext µs | CT µs "
        "| re-render µs | floor µs |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        for label, name in windows:
            ours, ct, floor = r[f"verl_ext_{label}"], r[f"verl_ct_{label}"], r[f"floor_{label}"]
            flat = fmt(r["verl_ext_late"] / r["verl_ext_early"], 2) if label == "late" else ""
            lines.append(
                f"| {r['tokenizer']} | {r['size']:,} tokens | {name} | {fmt(ours / ct, 2)} | {fmt(ours / floor, 2)} "
                f"| {flat} | {fmt(ours)} | {fmt(ct)} | {fmt(r[f'rerender_{label}'])} | {fmt(floor)} |"
            )
    lines += [
        "",
        "End-of-rollout check (engine view + template view) against one full render of the final conversation, "
        "as transformers does it (`apply_chat_template(..., tokenize=True)`, HF) and as verl_ext does it "
        "(`ChatRenderer.render`, the render inside the check, which encodes long text in parallel pieces); fastest "
        f"of {CHECK_REPS} each, the three taking turns, set-up objects frozen out of the garbage collector; "
        "wall time, and CPU time (all threads) where named; and the check's "
        "share of verl_ext's token-side time for the rollout (per-turn bookkeeping + check, wall time). "
        f"TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM', '(unset)')}.",
        "",
        "| tokenizer | tool output | turns | tokens | check / HF render | check / render | CPU: check / render "
        "| check share | check ms | HF render ms | render ms | check CPU ms | render CPU ms "
        "| learning a shape (once per process) ms |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        share = r["check_s"] / (r["check_s"] + r["verl_ext_total_s"])
        lines.append(
            f"| {r['tokenizer']} | {r['size']:,} tokens | {r['check_turns']} | {r['tokens']:,} "
            f"| {r['check_s'] / r['hf_render_s']:.2f} | {r['check_s'] / r['render_s']:.2f} "
            f"| {r['check_cpu_s'] / r['render_cpu_s']:.2f} | {share:.0%} | {r['check_s'] * 1000:,.1f} "
            f"| {r['hf_render_s'] * 1000:,.1f} | {r['render_s'] * 1000:,.1f} | {r['check_cpu_s'] * 1000:,.1f} "
            f"| {r['render_cpu_s'] * 1000:,.1f} | {r['learn_ms']:,.1f} |"
        )
    lines += ["", "Goals:", "", *goal_lines(results)]
    return "\n".join(lines)


def goal_lines(results: Sequence[dict[str, Any]]) -> list[str]:
    """One line per goal: met everywhere, or where it is not (with the ratio)."""
    goals: list[tuple[str, list[str]]] = [
        ("flat, late / early <= 1.2", []),
        ("verl_ext / CT <= 0.5 (early and late)", []),
        ("verl_ext / floor <= 2 for outputs of 200 tokens or more (early and late)", []),
        ("check / one full render as transformers does it (apply_chat_template, tokenize=True) <= 1.0", []),
    ]
    # Not a goal: the check holds verl_ext's own render (its template view), so it cannot cost less than that one.
    own = [r["check_s"] / r["render_s"] for r in results]
    for r in results:
        where = f"{r['tokenizer']} {r['size']:,}"
        flat = r["verl_ext_late"] / r["verl_ext_early"]
        if flat == flat and not flat <= 1.2:  # NaN: the run had too few turns for the window
            goals[0][1].append(f"{where}: {flat:.2f}")
        for label in ("early", "late"):
            ct = r[f"verl_ext_{label}"] / r[f"verl_ct_{label}"]
            if ct == ct and not ct <= 0.5:
                goals[1][1].append(f"{where} {label}: {ct:.2f}")
            floor = r[f"verl_ext_{label}"] / r[f"floor_{label}"]
            if r["size"] >= 200 and floor == floor and not floor <= 2.0:
                goals[2][1].append(f"{where} {label}: {floor:.2f}")
        check = r["check_s"] / r["hf_render_s"]
        if not check <= 1.0:
            goals[3][1].append(f"{where}: {check:.2f}")
    return [
        *(
            f"- {goal}: " + ("met everywhere" if not misses else "NOT met at " + "; ".join(misses))
            for goal, misses in goals
        ),
        f"- (for reference) check / verl_ext's own render, which the check contains: {min(own):.2f}-{max(own):.2f}"
        if own
        else "- (no check measured)",
    ]


def draw(curves: dict[tuple[str, int], dict[str, list[float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted({n for n, _ in curves}, key=lambda n: [n for n, _ in curves].index(n))
    fig, axes = plt.subplots(len(names), len(SIZES), figsize=(4.2 * len(SIZES), 3.0 * len(names)), squeeze=False)
    styles = {
        "verl_ext": ("verl_ext", "tab:blue", "-"),
        "verl_ct": ("verl 0.9.1 CT builder", "tab:orange", "-"),
        "rerender": ("full re-render", "tab:red", "--"),
        "floor": ("floor (encode the new text once)", "tab:gray", ":"),
    }
    for i, name in enumerate(names):
        for j, size in enumerate(SIZES):
            ax = axes[i][j]
            for key, (label, color, style) in styles.items():
                ys = curves[(name, size)].get(key)
                if ys is None:
                    continue
                pts = [(k + 1, y) for k, y in enumerate(ys) if y == y]
                if key != "rerender":
                    pts = _smooth(pts)
                ax.plot(
                    *zip(*pts, strict=True),
                    style,
                    color=color,
                    label=label,
                    marker="o" if key == "rerender" else None,
                    markersize=3,
                )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{name}, tool outputs of {size:,} tokens", fontsize=9)
            ax.set_xlabel("turn")
            ax.set_ylabel("µs per turn")
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Per-turn bookkeeping cost as a rollout grows (lower is better; engine excluded)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _smooth(points: list[tuple[int, float]], width: int = 5) -> list[tuple[int, float]]:
    """A running median, so one descheduled turn on a shared machine does not read as growth."""
    ys = [y for _, y in points]
    out = []
    for i, (x, _) in enumerate(points):
        lo, hi = max(0, i - width // 2), min(len(ys), i + width // 2 + 1)
        out.append((x, statistics.median(ys[lo:hi])))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
