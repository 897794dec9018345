"""False alarms and detection: the check on rollouts built from random engine output, and on injected defects.

For each shipped tokenizer (and Qwen3 with thinking off): ``--rollouts`` rollouts built as ``verl_ext_tool_agent``
builds them from random engine output (``tests/loop_rollouts.py``: odd text, the template's own tool-call text,
random ids, stops, length cuts), each checked with the template view on. Printed per template: rollouts with a
defect per 1,000 (the goal is 0: the stream is right by construction), engine-view failures, and the check's cost
against one render of the final messages in the same run (``ChatRenderer.render``, the render the check holds).
Then, per template and the verl parser for its format, rollouts whose turns are tool calls written as models write
them (``tests/model_tool_calls.py``: other spacing, key order, number and string forms, one to three calls, calls the
parser cannot read), with their defect rate per 1,000 (goal 0) and how often the two tool-call causes were named.
Then the mutation suite (``tests/check/test_mutations.py``): every injected defect on every template (the same
five), the share reported in its turn (the goal is 100%), and the mutations a template cannot take, with why.
Last, per template, edit class and tokenizer kind of the generated variants (``tests/template_variants.py``:
whitespace around calls edited in the template's source; call markers as special tokens or as plain text), over
``--variant-rollouts`` rollouts each as ``tests/check/test_template_variants.py`` draws them (half with call-marker
text inside a string argument): rollouts with a defect per 1,000, rollouts with a misread call per 1,000, and the
share of the three message mutations (changed argument, dropped call, swapped calls) reported in the call turn.

    PYTHONPATH=. .venv/bin/python bench/check_false_alarms.py [--rollouts 1000] [--tool-rollouts 300] [--seed 0]
        [--variant-rollouts 8] [--only variants]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "check")]
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from loop_rollouts import ODD_TEXT, build_loop_rollout, canonical_call_text, verl_parser  # noqa: E402

from verl_ext.check import ConsistencyChecker  # noqa: E402
from verl_ext.check.policy import CheckPolicy  # noqa: E402
from verl_ext.core.probe import probe_template  # noqa: E402
from verl_ext.demo.run import shipped_tokenizers  # noqa: E402

CASES = [
    ("qwen3", {}),
    ("qwen3", {"enable_thinking": False}),
    ("qwen2.5", {}),
    ("gpt-oss", {}),
    ("mistral-7b-v0.3", {}),
]
TOOL_TEXTS = ["2", "", " 3\n", "<|im_end|>", "x\ny", "  "]


def random_output(rng: random.Random, r, profile, calls: list[str]) -> list[int]:
    """One engine output: up to 5 pieces (odd text, the template's tool-call text, random ids, random characters),
    each encoded on its own, then a close, another stop, or nothing."""
    ids: list[int] = []
    for _ in range(rng.randint(0, 5)):
        kind = rng.randrange(4)
        if kind == 0:
            ids += r.encode(rng.choice(ODD_TEXT))
        elif kind == 1 and calls:
            ids += r.encode(rng.choice(calls))
        elif kind == 2:
            ids += [rng.randrange(r.vocab_size) for _ in range(rng.randint(1, 6))]
        else:
            ids += r.encode("".join(chr(rng.randint(32, 0x2FFF)) for _ in range(rng.randint(1, 6))))
    ending = rng.randrange(3)
    if ending == 0 and profile.close_id_set:
        ids.append(rng.choice(sorted(profile.close_id_set)))
    elif ending == 1 and profile.stop_id_set:
        ids.append(rng.choice(sorted(profile.stop_id_set)))
    return ids


def false_alarms(family: str, kwargs: dict, rollouts: int, seed: int) -> dict:
    from transformers import AutoTokenizer

    from verl_ext.core.rendering import ChatRenderer

    r = ChatRenderer(AutoTokenizer.from_pretrained(str(shipped_tokenizers()[family])), template_kwargs=kwargs)
    profile = probe_template(r)
    parser = verl_parser(r, profile)
    calls = [canonical_call_text(r, profile, {"expression": "1+2"}), canonical_call_text(r, profile, '{"x": "3"}')]
    checker = ConsistencyChecker(r, profile, CheckPolicy(mode="warn"))
    rng = random.Random(seed)
    defective = engine_failures = 0
    check_s = render_s = 0.0
    examples: list[str] = []
    for _ in range(rollouts):
        outputs = [random_output(rng, r, profile, calls) for _ in range(rng.randint(1, 4))]
        texts = [rng.choice(TOOL_TEXTS) for _ in range(4)]
        _, rollout = build_loop_rollout(
            r,
            profile,
            parser,
            outputs,
            texts,
            user_after_text=rng.random() < 0.5,
            response_length=rng.choice([16, 64, 512]),
        )
        started = time.perf_counter()
        result = checker.check_rollout(rollout, template_view=True)
        check_s += time.perf_counter() - started
        started = time.perf_counter()
        r.render(rollout.messages, rollout.tools)
        render_s += time.perf_counter() - started
        engine_failures += bool(result.engine_failures)
        defects = [f for f in result.findings if not f.allowed]
        if defects:
            defective += 1
            if len(examples) < 3:
                f = defects[0]
                examples.append(
                    f"{f.cause.value} turn {f.turn}: {f.stream_text[:40]!r} vs {f.rendered_text[:40]!r}: "
                    + f.detail[:300]
                )
    label = family + ("" if not kwargs else " " + ",".join(f"{k}={v}" for k, v in kwargs.items()))
    return {
        "template": label,
        "per_1000": 1000 * defective / rollouts,
        "engine": engine_failures,
        "ratio": check_s / render_s,
        "check_ms": 1000 * check_s / rollouts,
        "render_ms": 1000 * render_s / rollouts,
        "examples": examples,
    }


# Tool calls as models write them, per template and verl parser (tests/model_tool_calls.py): (label, template,
# template kwargs, format, whether the model writes its own reasoning block).
MODEL_CALL_CASES = [
    ("qwen3 hermes", "qwen3", {}, "hermes", True),
    ("qwen3 enable_thinking=False hermes", "qwen3", {"enable_thinking": False}, "hermes", False),
    ("qwen2.5 hermes", "qwen2.5", {}, "hermes", False),
    ("gpt-oss", "gpt-oss", {}, "gpt-oss", False),
    ("qwen3-coder qwen3_coder", "qwen3/qwen3-coder-30b-a3b-instruct_ollama-gguf", {}, "qwen3_coder", False),
    ("qwq-32b hermes", "qwen3/qwq-32b", {}, "hermes", True),
    ("Kimi-K2 kimi", "templates/moonshotai-Kimi-K2", {}, "kimi", False),
    ("Seed-OSS seed", "templates/ByteDance-Seed-OSS", {}, "seed", False),
]


def model_call_alarms(label: str, template: str, kwargs: dict, fmt: str, reasoning: bool, rollouts: int, seed: int):
    """Rollouts with defects per 1,000 among ``rollouts`` built from tool-call turns written as models write them
    (drawn by the property test's own strategy, ``hypothesis`` seeded), checked with the template view on."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st
    from model_tool_calls import FORMATS
    from test_loop_output_property import draw_model_call_rollout, model_call_renderer
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.tool_parser import ToolParser

    from verl_ext.core.rendering import ChatRenderer

    def renderer_for(name: str) -> ChatRenderer:
        return ChatRenderer(AutoTokenizer.from_pretrained(str(shipped_tokenizers()[name])))

    r = model_call_renderer(renderer_for, template, kwargs)
    profile = probe_template(r)
    parser = ToolParser.get_tool_parser(FORMATS[fmt], r.tokenizer)
    checker = ConsistencyChecker(r, profile, CheckPolicy(mode="warn"))
    seen = {"n": 0, "defective": 0, "engine": 0, "malformed": 0, "reserialized": 0}
    examples: list[str] = []

    @hypothesis_seed(seed)
    @settings(max_examples=rollouts, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.data())
    def one(data):
        rollout = draw_model_call_rollout(data, r, profile, parser, fmt, reasoning)
        result = checker.check_rollout(rollout, template_view=True)
        seen["n"] += 1
        seen["engine"] += bool(result.engine_failures)
        counts = result.cause_counts()
        seen["malformed"] += counts.get("malformed_tool_call", 0)
        seen["reserialized"] += counts.get("tool_call_reserialized", 0)
        if result.defects:
            seen["defective"] += 1
            f = result.defects[0]
            if len(examples) < 3:
                examples.append(
                    f"{f.cause.value} turn {f.turn}: {f.stream_text[:40]!r} vs {f.rendered_text[:40]!r}: "
                    + f.detail[:300]
                )

    one()
    return {"template": label, "per_1000": 1000 * seen["defective"] / max(seen["n"], 1), **seen, "examples": examples}


def mutation_detection() -> tuple[int, int, list[str], list[str]]:
    """(caught, injected, the names missed, the names that cannot apply with why) over every mutation of the suite
    on every template it covers."""
    import _pytest.outcomes
    import test_mutations as suite

    caught = injected = 0
    missed: list[str] = []
    skipped: list[str] = []
    for case in suite.CASES:
        for name, m in suite.MUTATIONS.items():
            try:
                result = suite.mutated(case, name)
            except _pytest.outcomes.Skipped as why:
                skipped.append(f"{case}: {name} ({why.msg.split(': ', 1)[-1][:90]})")
                continue
            injected += 1
            if suite.reported_in_turn(result, m.turn):
                caught += 1
            else:
                missed.append(f"{case}: {name}")
    return caught, injected, missed, skipped


def variant_rates(variant, rollouts: int, seed: int) -> dict:
    """One generated variant's rates over ``rollouts`` drawn rollouts (half with marker text inside arguments) and
    its mutation results; ``skipped``: why it could not be built."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st
    from test_template_variants import built, mutation_results, one_rollout

    b = built(variant)
    if isinstance(b, str):
        return {"skipped": b}
    checker = ConsistencyChecker(b.renderer, b.profile, CheckPolicy(mode="warn"))
    seen = {"n": 0, "defective": 0, "misread": 0, "ambiguous": 0}
    seen |= {"inside_" + k: 0 for k in list(seen)}
    examples: list[str] = []

    def run(inside: bool, n: int) -> None:
        key = "inside_" if inside else ""

        @hypothesis_seed(seed)
        @settings(max_examples=n, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(st.data())
        def one(data):
            o = one_rollout(data, b, checker, inside)
            seen[key + "n"] += 1
            seen[key + "defective"] += bool(o.defects)
            misread = bool(o.misread and not o.ambiguous) or bool(o.left)  # a marker left in the content: misread
            seen[key + "misread"] += misread
            seen[key + "ambiguous"] += o.ambiguous
            if (o.defects or misread) and len(examples) < 2:
                what = o.defects[0] if o.defects else ("misread", o.misread[0] if o.misread else o.left)
                examples.append(f"{'inside ' if inside else ''}{o.text[0][:160]!r}: {str(what)[:300]}")

        if n:
            one()

    run(False, rollouts - rollouts // 2)
    run(True, rollouts // 2)
    mutations = mutation_results(b)
    applicable = {k: v for k, v in mutations.items() if k != "clean" and isinstance(v, bool)}
    return {
        **seen,
        "clean": mutations["clean"],
        "caught": sum(applicable.values()),
        "mutations": len(applicable),
        "examples": examples,
    }


def _rate(row: dict, key: str, what: str = "defective") -> str:
    """Rollouts with ``what`` per 1,000 among the row's ``key`` rollouts ("-" where none ran)."""
    return f"{1000 * row[key + what] / row[key + 'n']:.0f}" if row[key + "n"] else "-"


_COUNTS = ("n", "defective", "misread", "ambiguous")


def _summed(rows: list[dict]) -> dict:
    """The counts of several variants' rows added up (rollouts, defects, misreads, ambiguous renders, with and
    without marker text in an argument; mutations; variants with a failure)."""
    out = {**{p + k: sum(r[p + k] for r in rows) for k in _COUNTS for p in ("", "inside_")}, "variants": len(rows)}
    out["caught"], out["mutations"] = sum(r["caught"] for r in rows), sum(r["mutations"] for r in rows)
    out["failing"] = sum(bool(r["failing"]) for r in rows)
    out["unclean"] = sum(not r["clean"] for r in rows)
    return out


def _ambiguous(row: dict) -> str:
    """Rollouts with an ambiguous render per 1,000 among all the row's rollouts."""
    n = row["n"] + row["inside_n"]
    return f"{1000 * (row['ambiguous'] + row['inside_ambiguous']) / n:.0f}" if n else "-"


def _rates(row: dict) -> str:
    caught = f"{row['caught']}/{row['mutations']}" + (f" ({row['unclean']} unclean)" if row.get("unclean") else "")
    return (
        f"{_rate(row, '')} | {_rate(row, '', 'misread')} | {_rate(row, 'inside_')} | "
        f"{_rate(row, 'inside_', 'misread')} | {_ambiguous(row)} | {caught}"
    )


_RATE_HEAD = (
    "defects per 1,000 | misread per 1,000 | marker-in-string defects per 1,000 | marker-in-string misread per 1,000 "
    "| ambiguous render per 1,000 | mutations caught"
)


def _summary_tables(rows: list[tuple[object, dict]]) -> None:
    """The rows summed per template and tokenizer kind, then per edit class and tokenizer kind."""
    for title, key in (("template", lambda v: v.template), ("edit class", lambda v: v.edit)):
        groups: dict[tuple[str, str], list[dict]] = {}
        for v, row in rows:
            groups.setdefault((key(v), v.kind), []).append(row)
        print(f"\nper {title} and tokenizer kind (rates over all their variants' rollouts)\n")
        print(f"| {title} | tokenizer | variants | with a failure | {_RATE_HEAD} |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for (name, kind), group in sorted(groups.items()):
            total = _summed(group)
            print(f"| {name} | {kind} | {total['variants']} | {total['failing']} | {_rates(total)} |")


def variant_table(rollouts: int, seed: int, only: str = "") -> None:
    """The rates of every generated variant, one table row each, then the examples of the failing ones, then the
    rates per template and per edit class (each with its tokenizer kind)."""
    from template_variants import all_variants

    started = time.perf_counter()
    from call_reader_cases import LEARNED

    everything = all_variants(tuple(sorted(c for c in LEARNED if only in c)))
    kept = [v for v, why in everything if not why]
    print(
        f"\ngenerated template variants: {len(kept)} of {len(everything)} kept ({time.perf_counter() - started:.0f} s "
        f"to generate); {rollouts} rollouts each (seed {seed}), half with call-marker text inside an argument; "
        "an ambiguous render (the template renders the calls read as it renders the calls drawn, proven by "
        "rendering both) is counted apart, never as a misread\n"
    )
    print(f"| template | edit class | tokenizer | {_RATE_HEAD} |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    failing: list[tuple[str, list[str]]] = []
    skipped: list[str] = []
    rows: list[tuple[object, dict]] = []
    for k, v in enumerate(kept, 1):
        row = variant_rates(v, rollouts, seed)
        if "skipped" in row:
            skipped.append(f"{v.name}: {row['skipped']}")
            continue
        row["failing"] = bool(row["examples"] or row["caught"] < row["mutations"] or not row["clean"])
        row["unclean"] = int(not row["clean"])
        rows.append((v, row))
        print(f"| {v.template} | {v.edit} | {v.kind} | {_rates(row)} |", flush=True)
        if row["failing"]:
            failing.append((v.name, row["examples"]))
        print(f"  [{k}/{len(kept)} variants, {time.perf_counter() - started:.0f} s]", file=sys.stderr, flush=True)
    for name, examples in failing:
        for example in examples or ["(mutations)"]:
            print(f"  {name}: {example}")
    for line in skipped:
        print(f"  not built: {line}")
    _summary_tables(rows)
    ambiguous = sum(r["ambiguous"] + r["inside_ambiguous"] for _, r in rows)
    print(
        f"\n{len(failing)} of {len(kept) - len(skipped)} variants with a false defect, misread call or missed mutation;"
        f" {ambiguous} rollouts with an ambiguous render ({time.perf_counter() - started:.0f} s)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1000, help="random-output rollouts per template")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tool-rollouts", type=int, default=300, help="tool-call rollouts per template")
    parser.add_argument("--variant-rollouts", type=int, default=8, help="rollouts per generated template variant")
    parser.add_argument("--only", choices=["variants"], help="run only the generated template variants' table")
    parser.add_argument("--template", default="", help="variants of the templates whose name holds this text only")
    args = parser.parse_args()
    asyncio.set_event_loop(asyncio.new_event_loop())
    logging.getLogger("verl").setLevel(logging.CRITICAL)  # verl's parser logs every unreadable random tool call
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load average {os.getloadavg()}")
    if args.only == "variants":
        variant_table(args.variant_rollouts, args.seed, args.template)
        return 0
    print(f"{args.rollouts} random-output rollouts per template, seed {args.seed}, template view on every rollout\n")
    print(
        "| template | rollouts with a defect per 1,000 | engine-view failures | check / render | check ms | render ms |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for family, kwargs in CASES:
        row = false_alarms(family, kwargs, args.rollouts, args.seed)
        rows.append(row)
        print(
            f"| {row['template']} | {row['per_1000']:.1f} | {row['engine']} | {row['ratio']:.2f} | "
            f"{row['check_ms']:.2f} | {row['render_ms']:.2f} |",
            flush=True,
        )
    for row in rows:
        for example in row["examples"]:
            print(f"  {row['template']}: {example}")
    print(
        f"\ntool calls as models write them: up to {args.tool_rollouts} rollouts per template "
        f"(hypothesis, seed {args.seed})\n"
    )
    print(
        "| template, parser | rollouts | with a defect per 1,000 | engine-view failures | tool_call_reserialized "
        "| malformed_tool_call |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for case in MODEL_CALL_CASES:
        row = model_call_alarms(*case, args.tool_rollouts, args.seed)
        rows.append(row)
        print(
            f"| {row['template']} | {row['n']} | {row['per_1000']:.1f} | {row['engine']} | {row['reserialized']} | "
            f"{row['malformed']} |",
            flush=True,
        )
        for example in row["examples"]:
            print(f"  {row['template']}: {example}")
    caught, injected, missed, skipped = mutation_detection()
    print(
        f"\nmutation suite: {caught} of {injected} injected defects reported in their turn "
        f"({100 * caught / injected:.0f}%) over {len(CASES)} templates; {len(skipped)} cannot apply"
    )
    for name in missed:
        print(f"  missed: {name}")
    for name in skipped:
        print(f"  cannot apply: {name}")
    worst = max(row["per_1000"] for row in rows)
    print(
        f"\ngoals: false alarms 0 per 1,000 ({'met' if worst == 0 else f'not met: up to {worst:.1f}'}); "
        f"detection 100% ({'met' if caught == injected else 'not met'})"
    )
    variant_table(args.variant_rollouts, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
