"""What a long-lived gateway keeps of the sessions it served: bytes retained per ended session (goal: 0 within noise).

The in-training gateway (``verl_ext_gateway_agent``) lives as long as the training job, so whatever it keeps of an
ended session grows with every row it ever served. This serves sessions of about 1,300 tokens each (a long user
message and a forced answer, on the real Qwen3 tokenizer and a tiny random Qwen3 model on verl_ext's CPU engine, with
records written) and measures, under ``tracemalloc``, the memory still allocated after each batch of ended sessions
(after a garbage collection), against what one open session holds (its branch's stream, messages, engine-call log):

- ``retained per ended session``: the growth between two batches, divided by the batch's sessions; what remains is
  the ended id and its reason (about 200 bytes, bounded by ``GatewayConfig.ended_ids``);
- ``held per open session``: the same growth with every session left open (a gateway that kept ended sessions held
  about this much per session, the 60-76 KiB measured before sessions were released);
- the ratio of the two.

Run: ``python bench/gateway_memory.py [--sessions 300]``. Prints; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "gateway"))

ANSWER = "Hello, here is the summary you asked for.<|im_end|>"


def build(tmp: Path) -> Any:
    """A gateway on the tiny model and the real Qwen3 tokenizer, writing records under ``tmp``."""
    import torch
    from gateway_fixtures import Script
    from transformers import AutoTokenizer

    from verl_ext.core.probe import probe_template
    from verl_ext.core.rendering import ChatRenderer
    from verl_ext.demo.model import build_tiny_qwen3
    from verl_ext.demo.run import shipped_tokenizers
    from verl_ext.gateway.cpu_engine import CPUEngine
    from verl_ext.gateway.parsing import ToolCallReader, reasoning_markers
    from verl_ext.gateway.service import Gateway, GatewayConfig
    from verl_ext.runtime import RolloutRuntime
    from verl_ext.telemetry.records import RecordWriter, header_record

    torch.set_num_threads(1)  # thousands of tiny forward passes: one thread is fastest on a shared machine
    model = build_tiny_qwen3(tmp / "model", shipped_tokenizers()["qwen3"], seed=0)
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    renderer = ChatRenderer(tokenizer)
    profile = probe_template(renderer)
    script = Script(tokenizer)
    script.turns = [ANSWER]
    writer = RecordWriter(tmp / "records", header_record(profile), prefix="gateway")
    runtime = RolloutRuntime.build(renderer).with_writer(writer)
    engine = CPUEngine(str(model), teacher_force=script)
    reader = ToolCallReader(tokenizer, "hermes")
    return Gateway(engine, runtime, reader, GatewayConfig(), markers=reasoning_markers(tokenizer))


def serve(gateway: Any, first: int, count: int, end: bool) -> None:
    """``count`` sessions of one long user message and the forced answer; ended or left open."""
    from verl_ext.gateway.request import parse_chat_request

    text = " ".join(f"item {k}: the quick brown fox jumps over the lazy dog." for k in range(100))  # ~1,300 tokens

    async def run() -> None:
        for k in range(first, first + count):
            body = {"messages": [{"role": "user", "content": f"{text} ({k})"}], "max_tokens": 16}
            await gateway.complete(f"s{k}", parse_chat_request(body))
            if end:
                gateway.end(f"s{k}")

    asyncio.run(run())


def growth(gateway: Any, first: int, count: int, end: bool) -> float:
    """Bytes still allocated after ``count`` more sessions (and a collection), per session."""
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    serve(gateway, first, count, end)
    gc.collect()
    return (tracemalloc.get_traced_memory()[0] - before) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=300, help="sessions per measured batch (default 300)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        gateway = build(Path(tmp))
        serve(gateway, 0, 50, end=True)  # warm: caches of the template, the check and the engine fill here
        tracemalloc.start()
        started = time.perf_counter()
        print(f"serving {args.sessions} ended sessions, then {args.sessions} more ...", flush=True)
        growth(gateway, 1_000_000, args.sessions, end=True)  # the LRU caches' last entries settle
        ended = growth(gateway, 2_000_000, args.sessions, end=True)
        print(f"  done in {time.perf_counter() - started:.0f} s; {args.sessions} sessions left open ...", flush=True)
        held = growth(gateway, 3_000_000, args.sessions, end=False)
        tracemalloc.stop()
        gateway.end_all()
    print(f"retained per ended session: {ended / 1024:8.2f} KiB   (goal: 0 within noise)")
    print(f"held per open session:      {held / 1024:8.2f} KiB")
    print(f"ratio ended / open:         {ended / held:8.3f}")


if __name__ == "__main__":
    main()
