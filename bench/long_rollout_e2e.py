"""End to end at 1,000 turns: one rollout through the real ``verl_ext_tool_agent`` on the CPU engine.

The loop is verl_ext's registered agent loop (``plugin/agent_loop.py``) built from verl's own composed config and
tools, driven as verl's agent-loop worker drives it (``await loop.run(sampling_params, raw_prompt=...)``, as
``tests/plugin/test_agent_loop.py`` runs it without a trainer). Its engine is the CPU engine's
``CPUGenerationServer`` in process, behind verl's server-manager interface, serving a tiny random Qwen3-architecture
model with the real Qwen3 tokenizer and template. A random model never calls a tool, so the engine's TEST/DEMO hook
teacher-forces a short calculator call as every turn (``force_every_turn``; the forced ids go through the engine's
own generation loop, scored by the model like sampled ids), and the engine keeps the last request's keys and values
(``prefix_cache``) so each turn reads only its new ids. The tool runs (verl's function tool, the demo calculator), its
short result is appended, and the rollout ends at ``max_assistant_turns``.

Printed while it runs: every ``--every`` turns the stream length, the mean wall time per turn over those turns (the
engine, and the loop: everything between one engine call's return and the next call, tools included) and the
process's resident memory. At the end: per-turn wall time early (turns 2-32) vs late (the last 100) of the engine
and of the loop (also in process CPU time, per block of 100 turns, and split into the list copy of the whole prompt
that verl's server-manager interface takes every turn, timed alone at each turn's prompt length, and the rest), what
the loop holds (``--tracemalloc``: Python memory traced at the last engine call, per stream token), the check's time
against one transformers render + encode of the final conversation (the same ratio as ``bench/long_horizon.py``),
the verdict, and what ``verl-ext report`` and ``verl-ext replay`` say of the record the loop wrote.

Every figure is a ratio within one run, with the machine and its load printed. Not a test. Usage::

    python bench/long_rollout_e2e.py [--turns 1000] [--out build/long_rollout_e2e] [--tracemalloc]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests" / "plugin"))  # verl's composed config and tool loader, as the loop tests use

from turns import load_note  # noqa: E402

# A short hermes call the calculator answers with "2": about 40 stream tokens a turn with its reply.
FORCED_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"}}\n</tool_call><|im_end|>'
PROMPT = [
    {"role": "system", "content": "Use the calculator tool."},
    {"role": "user", "content": "Add one and one, again and again."},
]
PROMPT_LENGTH = 1024
TOKENS_PER_TURN = 64  # response budget per turn (a turn takes about 40): the rollout must end on its turn limit
EARLY = range(2, 33)  # 1-based turns compared with the last 100 for flatness
FLAT_GOAL, CHECK_GOAL = 1.25, 1.0


def rss_mib() -> float:
    """The process's resident memory now (Linux /proc; the peak from getrusage elsewhere)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class TimedServer:
    """verl's server-manager interface (``generate(request_id=, prompt_ids=, sampling_params=, image_data=)``, as
    ``AsyncLLMServerManager`` serves the agent loop) over the in-process CPU server. Keeps when each call began
    and returned and the prompt's length (never a copy of the prompt), and prints progress."""

    server: Any
    every: int
    trace: bool
    began: list[float] = field(default_factory=list)
    ended: list[float] = field(default_factory=list)
    began_cpu: list[float] = field(default_factory=list)  # the process's CPU time at the same moments
    ended_cpu: list[float] = field(default_factory=list)
    prompt_lengths: list[int] = field(default_factory=list)
    traced_bytes: list[int] = field(default_factory=list)  # Python memory traced as each call began (--tracemalloc)

    async def generate(
        self, request_id: str, *, prompt_ids: Sequence[int], sampling_params: dict[str, Any], **kwargs: Any
    ) -> Any:
        """One engine call, timed."""
        if self.trace:
            self.traced_bytes.append(tracemalloc.get_traced_memory()[0])
        self.began_cpu.append(time.process_time())
        self.began.append(time.perf_counter())
        self.prompt_lengths.append(len(prompt_ids))
        out = await self.server.generate(prompt_ids, sampling_params, request_id, kwargs.get("image_data"))
        self.ended.append(time.perf_counter())
        self.ended_cpu.append(time.process_time())
        n = len(self.ended)
        if n % self.every == 0:
            window = range(max(1, n - self.every), n)  # turns whose next call has begun
            engine = statistics.fmean(self.ended[k] - self.began[k] for k in window) * 1000
            loop = statistics.fmean(self.began[k] - self.ended[k - 1] for k in window) * 1000
            print(
                f"  turn {n:5d}: prompt {len(prompt_ids):6d} tokens; per turn over the last {len(window)}: engine "
                f"{engine:7.2f} ms, loop {loop:6.2f} ms; RSS {rss_mib():7.1f} MiB",
                flush=True,
            )
        return out

    def per_turn(self) -> tuple[list[float], list[float], list[float], list[float]]:
        """Per finished turn k (its next call began): wall time call to call, the engine's part, the loop's part, and
        the loop's part in process CPU time (what other jobs on a shared machine inflate least)."""
        turns = range(len(self.began) - 1)
        wall = [self.began[k + 1] - self.began[k] for k in turns]
        engine = [self.ended[k] - self.began[k] for k in turns]
        loop = [self.began[k + 1] - self.ended[k] for k in turns]
        loop_cpu = [self.began_cpu[k + 1] - self.ended_cpu[k] for k in turns]
        return wall, engine, loop, loop_cpu


@dataclass
class Timed:
    """Wall seconds of each call of a wrapped method, and what it last returned and was passed."""

    seconds: list[float] = field(default_factory=list)
    last_args: tuple[Any, ...] = ()
    last_result: Any = None

    def wrap(self, method: Callable[..., Any]) -> Callable[..., Any]:
        """``method``, timed (the real method runs; nothing is replaced)."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            result = method(*args, **kwargs)
            self.seconds.append(time.perf_counter() - began)
            self.last_args, self.last_result = args, result
            return result

        return timed


def build_loop(model_dir: Path, turns: int, records: Path, every: int, trace: bool) -> tuple[Any, TimedServer]:
    """``verl_ext_tool_agent`` over the CPU engine, from verl's composed config and verl's function-tool loader."""
    from loop_harness import DEMO_TOOLS, load_tools, verl_config
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_ext.engines.cpu import CPUGenerationServer
    from verl_ext.plugin.agent_loop import VerlExtToolAgentLoop

    response_length = TOKENS_PER_TURN * turns
    cfg = verl_config(
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.multi_turn.format=hermes",
            f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={turns}",
            f"actor_rollout_ref.rollout.prompt_length={PROMPT_LENGTH}",
            f"actor_rollout_ref.rollout.response_length={response_length}",
        ]
    )
    server = CPUGenerationServer(
        str(model_dir),
        prompt_length=PROMPT_LENGTH,
        response_length=response_length,
        force_text=FORCED_CALL,
        force_every_turn=True,
        prefix_cache=True,
    )
    timed = TimedServer(server, every, trace)
    loop = VerlExtToolAgentLoop(
        trainer_config=DictConfigWrap(cfg),
        server_manager=timed,
        tokenizer=AutoTokenizer.from_pretrained(str(model_dir)),
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(cfg.data),
        tools=ToolListWrap(load_tools(DEMO_TOOLS)),
        hf_model_type="qwen3",
        verl_ext={"records": {"dir": str(records)}, "check": {"template_view_rate": 1.0}},
    )
    return loop, timed


def hf_render_seconds(tokenizer: Any, messages: Sequence[Any], tools: Any, reps: int = 3) -> float:
    """One transformers render + encode of the final conversation (``apply_chat_template(..., tokenize=True)``),
    fastest of ``reps``: the baseline the check is compared with."""
    best = float("inf")
    for _ in range(reps):
        gc.collect()
        began = time.perf_counter()
        tokenizer.apply_chat_template([dict(m) for m in messages], tools=tools, tokenize=True)
        best = min(best, time.perf_counter() - began)
    return best


def cli(*args: str) -> tuple[int, str]:
    """``verl-ext ARGS`` as a user runs it (this tree's code), its exit status and output."""
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [sys.executable, "-m", "verl_ext.cli.main", *args], capture_output=True, text=True, env=env, check=False
    )
    return done.returncode, (done.stdout + done.stderr).strip()


def window(values: Sequence[float], turns: range) -> float:
    return statistics.fmean(values[k - 1] for k in turns if k <= len(values))


def prompt_copy_seconds(length: int, reps: int = 7) -> float:
    """The list copy of a ``length``-token prompt that the loop hands verl's server-manager interface every turn
    (``engine_turn.generate_turn``: ``[*prompt_ids, *ids]`` of the trajectory's ``PromptIds`` view; verl's servers
    take lists), fastest of ``reps``: the part of the loop's turn that grows with the stream by construction."""
    from array import array

    from verl_ext.core.prompt_ids import PromptIds

    view = PromptIds(array("i", range(length)))
    best = float("inf")
    for _ in range(reps):
        began = time.perf_counter()
        [*view]  # noqa: B018 -- the copy is what is timed
        best = min(best, time.perf_counter() - began)
    return best


def hundreds(wall: Sequence[float], cpu: Sequence[float]) -> list[str]:
    """The loop's mean per turn in each block of 100 turns, wall and CPU ms: where the growth, if any, lies."""
    return [
        f"{k + 1}-{min(k + 100, len(wall))}: {statistics.fmean(wall[k : k + 100]) * 1000:.2f}/"
        f"{statistics.fmean(cpu[k : k + 100]) * 1000:.2f}"
        for k in range(0, len(wall), 100)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", type=int, default=1000)
    p.add_argument("--out", type=Path, default=REPO / "build" / "long_rollout_e2e", help="model, records, report")
    p.add_argument("--every", type=int, default=100, help="print progress every N turns")
    p.add_argument("--tracemalloc", action="store_true", help="trace Python memory (slows the loop: read its ratios)")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch's intra-op threads (1: a shared machine's other jobs stall a second thread's every small op)",
    )
    args = p.parse_args(argv)
    if args.turns < max(EARLY) + 2:
        p.error(f"--turns must be at least {max(EARLY) + 2}")

    import torch

    from verl_ext.demo.model import build_tiny_qwen3
    from verl_ext.demo.run import shipped_tokenizers
    from verl_ext.plugin import metrics_sink

    torch.set_num_threads(args.torch_threads)
    print(f"machine: {load_note()}; torch threads {torch.get_num_threads()}", flush=True)
    shutil.rmtree(args.out, ignore_errors=True)
    records = args.out / "records"
    model_dir = build_tiny_qwen3(
        args.out / "tiny-qwen3",
        shipped_tokenizers()["qwen3"],
        max_position_embeddings=PROMPT_LENGTH + TOKENS_PER_TURN * args.turns,
    )
    loop, server = build_loop(model_dir, args.turns, records, args.every, args.tracemalloc)
    rt = loop.rt
    check, write = Timed(), Timed()
    rt.checker.check_rollout = check.wrap(rt.checker.check_rollout)  # timed around the real method
    assert rt.writer is not None
    rt.writer.write = write.wrap(rt.writer.write)
    metrics_sink.drain()

    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    gc.collect()
    rss_before = rss_mib()
    if args.tracemalloc:
        tracemalloc.start()
    began = time.perf_counter()
    # verl's loops bind the event loop current at construction (run_in_executor on it), as its worker does
    out = loop.loop.run_until_complete(loop.run(params, raw_prompt=PROMPT, global_steps=1, index=0))
    seconds = time.perf_counter() - began
    traced_peak = tracemalloc.get_traced_memory()[1] if args.tracemalloc else 0
    tracemalloc.stop()
    rss_after = rss_mib()

    calls = len(server.began)
    tokens = len(out.prompt_ids) + len(out.response_ids)
    wall, engine, loop_part, loop_cpu = server.per_turn()
    late = range(
        max(max(EARLY) + 1, calls - 100), calls
    )  # the last 100 finished turns (the last turn's "loop" is the rollout's end)
    failed = 0
    print(f"\n{calls} engine calls, {tokens} stream tokens in {seconds:.1f} s; machine now: {load_note()}")
    if calls != args.turns:
        print(f"FAIL: the rollout ended after {calls} turns, not {args.turns}")
        failed += 1
    copies = [prompt_copy_seconds(server.prompt_lengths[k]) for k in range(len(loop_part))]  # each turn's prompt
    minus_copy = [t - c for t, c in zip(loop_part, copies, strict=True)]
    rows = (
        ("wall", wall),
        ("engine", engine),
        ("loop (tools included)", loop_part),
        ("loop, process CPU time", loop_cpu),
        ("loop, of which the prompt's list copy for verl's server interface", copies),
        ("loop without that copy", minus_copy),
    )
    for name, values in rows:
        early_ms, late_ms = window(values, EARLY) * 1000, window(values, late) * 1000
        verdict = ""
        if name == "loop (tools included)":
            verdict = f" [{'PASS' if late_ms / early_ms <= FLAT_GOAL else 'FAIL'} flat <= {FLAT_GOAL}x]"
            failed += late_ms / early_ms > FLAT_GOAL
        print(
            f"per turn, {name}: {early_ms:.2f} ms (turns 2-32) -> {late_ms:.2f} ms (turns {late.start}-"
            f"{late.stop - 1}) = {late_ms / early_ms:.2f}x{verdict}"
        )
    print("loop per 100 turns (wall, process CPU):", "; ".join(hundreds(loop_part, loop_cpu)))
    print(f"resident memory: {rss_before:.0f} MiB before the rollout, {rss_after:.0f} MiB after")
    if args.tracemalloc:
        held = server.traced_bytes[-1] - server.traced_bytes[0]
        print(
            f"Python memory traced at the last engine call: {held / 2**20:.1f} MiB = "
            f"{held / server.prompt_lengths[-1]:.0f} B per stream token; peak {traced_peak / 2**20:.1f} MiB "
            "(the check's inputs included)"
        )

    rollout, result = check.last_args[0], check.last_result
    hf = hf_render_seconds(loop.tokenizer, rollout.messages, rollout.tools)
    ratio = check.seconds[-1] / hf
    failed += ratio > CHECK_GOAL
    print(
        f"check: {check.seconds[-1]:.2f} s vs transformers render + encode {hf:.2f} s = {ratio:.2f}x "
        f"[{'PASS' if ratio <= CHECK_GOAL else 'FAIL'} <= {CHECK_GOAL}x]; record written in {write.seconds[-1]:.2f} s"
    )
    metrics = metrics_sink.drain()
    print(
        f"verdict: {result.summary()}; engine-view failures {len(result.engine_failures)}, defects "
        f"{len(result.defects)}; tito/rollouts_checked {metrics.get('tito/rollouts_checked')}, "
        f"tito/tool/ok {metrics.get('tito/tool/ok')}"
    )
    if not result.ok or result.defects or result.engine_failures:
        failed += 1

    files = sorted(str(f) for f in records.glob("*.jsonl"))
    rc, said = cli("report", *files, "-o", str(args.out / "report.html"))
    print(f"verl-ext report -> exit {rc}: {said.splitlines()[-1] if said else ''}")
    failed += rc != 0
    rc, said = cli("replay", "--tokenizer", str(model_dir), "--json", *files)
    # the JSON array comes first; log lines may follow it
    replayed = json.JSONDecoder().raw_decode(said[said.index("[") :])[0] if rc == 0 and "[" in said else []
    for r in replayed:  # one per record: the replayed verdict, and whether the stored one says the same
        recorded = r.get("recorded") or {}
        print(
            f"verl-ext replay -> exit {rc}: {len(r['input_ids'])} tokens, {len(r['engine_calls'])} engine calls, ok "
            f"{r['ok']}, {len(r['failures'])} failures; same as the record's verdict: {recorded.get('same')} "
            f"({len(recorded.get('differences') or [])} differences)"
        )
        failed += not (r["ok"] and recorded.get("same"))
    if not replayed:
        print(f"verl-ext replay -> exit {rc}: {said[-400:]}")
    failed += rc != 0 or not replayed
    print("all goals met" if not failed else f"{failed} goal(s) missed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
