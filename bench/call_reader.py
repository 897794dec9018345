"""The derived tool-call reader's cost per turn against verl 0.9.1's hermes parser, on the same turns.

Turns of the real Qwen3 tokenizer: its template's own renders of 1 to 3 calls with drawn arguments, some after
content, some plain text without a call, each as the engine's ids (ending on ``<|im_end|>``). Per turn, verl's
``HermesToolParser.extract_tool_calls(ids)`` (it decodes the ids itself) against the derived reader as
``parse_turn`` runs it (decode the ids without the stop, read the text); both inside one event loop, taking turns,
each the fastest of ``--reps`` runs (``bench/_timing.fastest``). Both must read the same calls before anything is
timed. The goal: the derived reader at most 1.5x verl's parser. Prints a table and writes build/bench/call_reader.md.
Usage: ``python bench/call_reader.py [--turns 400] [--reps 5] [--out build/bench]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import fastest  # noqa: E402

GOAL = 1.5


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=400)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", default="build/bench")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from verl.experimental.agent_loop.tool_parser import ToolParser

    from verl_ext.core.call_reader import learn_call_reader
    from verl_ext.core.probe import probe_template
    from verl_ext.core.rendering import ChatRenderer, load_tokenizer
    from verl_ext.core.turn_end import end_of_turn_ids, message_body
    from verl_ext.demo.run import shipped_tokenizers

    r = ChatRenderer(load_tokenizer(shipped_tokenizers()["qwen3"]))
    profile = probe_template(r)
    reader = learn_call_reader(r, profile).reader
    assert reader is not None
    hermes = ToolParser.get_tool_parser("hermes", r.tokenizer)
    end_ids = end_of_turn_ids(profile)
    close = r.encode("<|im_end|>")
    rng = random.Random(0)
    prompt = [{"role": "user", "content": "Compute."}]
    head = r.render_text(prompt, None, add_generation_prompt=True)
    turns: list[list[int]] = []
    for i in range(args.turns):
        if i % 4 == 3:
            text = "The answer is " + " ".join(str(rng.randint(0, 999)) for _ in range(rng.randint(5, 60))) + "."
        else:
            calls = [
                {
                    "id": f"call{k:05d}",
                    "type": "function",
                    "function": {
                        "name": rng.choice(["calculator", "search"]),
                        "arguments": {
                            "expression": f"{rng.randint(0, 99)}+{rng.randint(0, 99)}",
                            "n": rng.randint(1, 9),
                        },
                    },
                }
                for k in range(rng.randint(1, 3))
            ]
            content = "Let me compute that step by step. " * rng.randint(0, 3)
            full = r.render_text([*prompt, {"role": "assistant", "content": content, "tool_calls": calls}], None)
            text = full[len(head) : full.rindex("<|im_end|>")]
        turns.append([*r.encode(text), *close])

    async def verl_all() -> list[list[tuple[str, dict]]]:
        out = []
        for ids in turns:
            _, calls = await hermes.extract_tool_calls(ids, [])
            out.append([(c.name, json.loads(c.arguments)) for c in calls])
        return out

    async def derived_all() -> list[list[tuple[str, dict]]]:
        out = []
        for ids in turns:
            read = reader.read(r.decode(message_body(ids, end_ids)))
            out.append([(c.name, json.loads(c.arguments)) for c in read.calls])
        return out

    same = asyncio.run(verl_all()) == asyncio.run(derived_all())
    assert same, "the two readers read different calls: nothing timed"
    best = fastest(
        {"verl_hermes": lambda: asyncio.run(verl_all()), "derived": lambda: asyncio.run(derived_all())}, args.reps
    )
    verl_us = best["verl_hermes"][0] / len(turns) * 1e6
    derived_us = best["derived"][0] / len(turns) * 1e6
    ratio = derived_us / verl_us
    load = os.getloadavg()
    lines = [
        f"machine: {platform.machine()} {os.cpu_count()} cores, load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}",
        f"turns: {len(turns)} (Qwen3 tokenizer and template; 3 in 4 with 1-3 calls), fastest of {args.reps} runs",
        "",
        "| reader | per turn (us) | ratio |",
        "|---|---|---|",
        f"| verl 0.9.1 hermes `extract_tool_calls` | {verl_us:.1f} | 1.00x |",
        f"| derived reader (decode + read) | {derived_us:.1f} | {ratio:.2f}x |",
        "",
        f"goal: at most {GOAL}x verl's hermes parser: {'met' if ratio <= GOAL else 'NOT met'}",
    ]
    print("\n".join(lines))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "call_reader.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return 0 if ratio <= GOAL else 1


if __name__ == "__main__":
    raise SystemExit(main())
