"""The four callers of the rollout runtime, on the same scripted engine output, write records that agree.

``verl_ext_tool_agent``, the audited stock loop, ``verl_ext_gateway_agent`` and the standalone gateway each drive one
``LiveRollout`` per row: the same row (a system and a user message, the calculator tool, Qwen3's template with a
date stamp, as Llama 3.2's has) and the same two scripted assistant turns (a tool call, then an answer), taught to
the same tiny model on CPU. Each gateway is driven by an OpenAI-SDK harness that sends the row's prompt and tools and
answers each call with the calculator, as the loop's tool does.

Must agree: the engine calls (prompt lengths, sampled ids, logprobs, finish), the messages (roles, content, the
calls' names and arguments), the template clock (the time each rollout started, in its prompt), ``num_turns``, the
check's verdict, what a failed record write counts, and, between the loops, the step, data source and index, and the
``trainer`` entry (``LiveRollout.finish`` writes it from the trainer mode and each call's weight label) with the sync
convention the record's versions carry.
Differ by design: tool-call ids (each loop names its own, a harness echoes the gateway's); the rollout id; the
standalone gateway's step, data source and index (it serves no training row: step 0, ``gateway``, the session id;
no trainer, so no ``trainer`` entry);
the stock loop's messages and verdict (verl's hermes parser keeps the stop token's text in the content, which the
check names) and its stream past what it shares with ours.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest
from gateway_fixtures import Script
from loop_harness import RecordingServer, load_tools, run_loop, verl_config

from verl_ext.plugin import metrics_sink
from verl_ext.report.loops import loop_of as record_loop

REPO = Path(__file__).resolve().parents[2]
PROMPT = [{"role": "system", "content": "Use the calculator tool."}, {"role": "user", "content": "What is 12 * 7?"}]
TURNS = [
    '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call><|im_end|>',
    "The answer is 84.<|im_end|>",
]
STAMP = "{{- '<|im_start|>system\\nToday Date: ' + strftime_now('%d %b %Y') + '<|im_end|>\\n' }}"
ROW = {"global_steps": 3, "data_source": "calc", "index": 7}
CALLERS = ("tool_agent", "audited", "gateway_agent", "gateway")


class ScriptedServer(RecordingServer):
    """verl's server manager over the CPU engine with every turn's ids taught by the script (the gateway's
    ``Script``: the turn is read from the prompt), so each caller's engine samples the same turns."""

    def __init__(self, server: Any, script: Script) -> None:
        super().__init__(server)
        self.script = script

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any):
        self.server.force_ids, self.server.force_every_turn = list(self.script(prompt_ids)), True
        return await super().generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kw)


@pytest.fixture(scope="module")
def stamped(tiny_qwen3_dir: Path) -> Any:
    """The tiny model's tokenizer with a template that stamps today's date, as Llama 3.2's does."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))
    tokenizer.chat_template = STAMP + tokenizer.chat_template
    return tokenizer


def loop_of(
    kind: str, model_dir: Path, tokenizer: Any, records: Path, options: dict[str, Any] | None = None, label: int = 2
) -> tuple[Any, ScriptedServer]:
    """One of verl's three agent loops of verl_ext, as verl's worker builds it, on a scripted CPU engine serving
    weight label ``label``; ``options``: verl_ext options over the records folder."""
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_ext.engines.cpu import CPUGenerationServer
    from verl_ext.plugin.agent_loop import VerlExtToolAgentLoop
    from verl_ext.plugin.audit_loop import AuditedToolAgentLoop
    from verl_ext.plugin.gateway_loop import VerlExtGatewayAgentLoop

    cfg = verl_config(
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.multi_turn.format=hermes",
            "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4",
            "actor_rollout_ref.rollout.prompt_length=512",
            "actor_rollout_ref.rollout.response_length=96",
        ]
    )
    server = ScriptedServer(
        CPUGenerationServer(str(model_dir), prompt_length=512, response_length=96), Script(tokenizer)
    )
    server.server.global_steps = label  # the weight label every output carries (verl's global_steps)
    server.script.turns = list(TURNS)
    cls = {"tool_agent": VerlExtToolAgentLoop, "audited": AuditedToolAgentLoop}.get(kind, VerlExtGatewayAgentLoop)
    extra = {"harness": {"function": "sdk_harness:loop_row"}} if kind == "gateway_agent" else {}
    loop = cls(
        trainer_config=DictConfigWrap(cfg),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=RLHFDataset,
        data_config=DictConfigWrap(cfg.data),
        tools=ToolListWrap(load_tools(REPO / "verl_ext" / "demo" / "tools.py")),
        verl_ext={"records": {"dir": str(records)}, **(options or {})},
        **extra,
    )
    return loop, server


def run_caller(kind: str, model_dir: Path, tokenizer: Any, records: Path) -> dict[str, Any]:
    """Run one row through ``kind``; what it handed on: its records, num_turns, metrics (or counters)."""
    from verl_ext.telemetry.records import read_records

    metrics_sink.drain()
    before = datetime.datetime.now().replace(microsecond=0)
    if kind == "gateway":
        num_turns, metrics = _standalone_gateway(model_dir, tokenizer, records)
    else:
        loop, _ = loop_of(kind, model_dir, tokenizer, records)
        out = run_loop(loop, PROMPT, **ROW, harness_tools=loop_tool_schemas())
        num_turns, metrics = out.num_turns, metrics_sink.drain()
    after = datetime.datetime.now()
    files = sorted(records.glob("*.jsonl"))
    _, found = read_records(files) if files else (None, [])
    return {"records": found, "num_turns": num_turns, "metrics": metrics, "started": (before, after)}


def _standalone_gateway(model_dir: Path, tokenizer: Any, records: Path) -> tuple[int, dict[str, Any]]:
    """``verl-ext gateway`` as the command builds it (``local_gateway``), served over HTTP, the harness against a
    session of it, then the session ended (``/end``'s call)."""
    import sdk_harness

    from verl_ext.core.rendering import ChatRenderer
    from verl_ext.gateway.cpu_engine import CPUEngine
    from verl_ext.gateway.local import local_gateway
    from verl_ext.gateway.server import ServerThread, create_app

    script = Script(tokenizer)
    script.turns = list(TURNS)
    engine = CPUEngine(str(model_dir), teacher_force=script)
    gateway = local_gateway(model_dir, records_dir=records, engine=engine, renderer=ChatRenderer(tokenizer))
    server = ServerThread(create_app(gateway, "policy")).start()
    try:
        row = {"raw_prompt": PROMPT, "harness_tools": loop_tool_schemas()}
        sdk_harness.loop_row(f"{server.url}/sessions/s/v1", "s", row)
    finally:
        server.stop()
    (branch,) = gateway.end("s", "the harness finished")
    return branch.finished.num_turns, dict(gateway.counters)


def loop_tool_schemas() -> list[dict[str, Any]]:
    """The calculator's schema as verl's tool agent renders it (its ``tool_schemas``): what the harness sends."""
    tools = load_tools(REPO / "verl_ext" / "demo" / "tools.py")
    return [t.tool_schema.model_dump(exclude_unset=True, exclude_none=True) for t in tools]


def calls_of(record: Any) -> list[tuple[Any, ...]]:
    return [(c.prompt_length, c.output_ids, c.logprobs, c.finish_reason) for c in record.engine_calls]


def verdict(record: Any) -> dict[str, Any]:
    """The record's check, less how long it took (the one field two runs of one check differ in)."""
    return {k: v for k, v in record.check.to_json().items() if k != "seconds"}


def messages_of(record: Any) -> list[tuple[Any, ...]]:
    """Each message's role, content and calls (name, arguments as JSON): not the ids each caller names calls by."""
    out = []
    for m in record.messages:
        calls = []
        for call in m.get("tool_calls") or ():
            arguments = call["function"]["arguments"]
            calls.append((call["function"]["name"], json.loads(arguments) if isinstance(arguments, str) else arguments))
        out.append((m["role"], m.get("content") or "", calls))
    return out


@pytest.fixture(scope="module")
def runs(tiny_qwen3_dir: Path, stamped: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each caller's run of the row, records written."""
    root = tmp_path_factory.mktemp("four_callers")
    return {kind: run_caller(kind, tiny_qwen3_dir, stamped, root / kind) for kind in CALLERS}


def test_the_four_callers_record_the_same_rollout(runs: dict[str, dict[str, Any]], stamped: Any) -> None:
    records = {kind: run["records"] for kind, run in runs.items()}
    assert all(len(found) == 1 for found in records.values()), {k: len(v) for k, v in records.items()}
    ours = {kind: found[0] for kind, found in records.items()}
    tool_agent = ours["tool_agent"]
    assert len(tool_agent.engine_calls) == 2 and tool_agent.check.ok, tool_agent.check
    for kind, record in ours.items():
        # the engine saw the same first prompt and sampled the same turns (the stock loop's later prompts are its own)
        calls, expected = calls_of(record), calls_of(tool_agent)
        assert calls[0] == expected[0], kind
        assert [c[1::2] for c in calls] == [c[1::2] for c in expected], kind  # sampled ids and finish of each turn
        if kind != "audited":
            assert calls == expected, kind
        assert runs[kind]["num_turns"] == 4, (kind, runs[kind]["num_turns"])  # prompt, call, tool result, answer
        # the template clock: the time the rollout started, and the date its prompt was rendered with
        before, after = runs[kind]["started"]
        assert record.template_clock is not None, kind
        clock = datetime.datetime.fromisoformat(record.template_clock)
        assert before <= clock <= after, (kind, record.template_clock)
        prompt = stamped.decode(list(record.input_ids[: record.prompt_length]))
        assert f"Today Date: {clock:%d %b %Y}" in prompt, kind
    for kind in ("gateway_agent", "gateway"):  # the rollouts our runtime renders: one stream, one verdict
        record = ours[kind]
        assert messages_of(record) == messages_of(tool_agent), kind
        assert record.input_ids == tool_agent.input_ids and record.loss_mask == tool_agent.loss_mask, kind
        assert record.check.ok and verdict(record) == verdict(tool_agent), (kind, record.check)
    for kind in ("audited", "gateway_agent"):  # the loops: the row's step, data source and index
        row = (ours[kind].step, ours[kind].extra.get("data_source"), ours[kind].extra.get("index"))
        assert row == (3, "calc", 7), kind
    assert (tool_agent.step, tool_agent.extra["data_source"], tool_agent.extra["index"]) == (3, "calc", 7)
    # the trainer entry: one object writes it for the three loops, from each call's label (the CPU engine's, set
    # in loop_of to 2: weights after 2 updates serve step 3, on-policy under the v1 trainer's sync mode)
    entries = {kind: ours[kind].extra.get("trainer") for kind in ("tool_agent", "audited", "gateway_agent")}
    assert entries == {
        kind: {"mode": "v1:sync", "sync": "after_update", "served": 2, "lag": 0, "problem": None} for kind in entries
    }, entries
    assert {kind: ours[kind].versions.sync.value for kind in entries} == dict.fromkeys(entries, "after_update")
    assert "trainer" not in ours["gateway"].extra
    # by design: the standalone gateway serves no training row, and the stock loop's parser keeps the stop text
    standalone = ours["gateway"]
    assert (standalone.step, standalone.extra["data_source"], standalone.extra["index"]) == (0, "gateway", "s")
    audited = ours["audited"]
    assert [m[0] for m in messages_of(audited)] == [m[0] for m in messages_of(tool_agent)]
    assert not audited.check.ok and "<|im_end|>" in audited.messages[2]["content"], audited.check
    causes = {f.cause for f in audited.check.findings}
    assert {"stop_text_in_message", "boundary_missing"} <= causes, causes
    assert len({r.rollout_id for r in ours.values()}) == 4
    # each record names the loop that wrote it, as the report reads it (its fix texts depend on it)
    loops = {kind: record_loop(record).value for kind, record in ours.items()}
    assert loops == {
        "tool_agent": "verl_ext_tool_agent",
        "audited": "verl_ext_audited_tool_agent",
        "gateway_agent": "verl_ext_gateway_agent",
        "gateway": "verl-ext gateway",
    }, loops
    assert all(record.extra["loop"] == loops[kind] for kind, record in ours.items())  # named, not inferred


def test_a_record_that_cannot_be_written_counts_the_same_from_the_four_callers(
    tiny_qwen3_dir: Path, stamped: Any, tmp_path: Path
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("records cannot be written under a file")
    counted = {}
    for kind in CALLERS:
        run = run_caller(kind, tiny_qwen3_dir, stamped, blocker / kind)
        key = "records/write_failures" if kind == "gateway" else "tito/records/write_failures"
        counted[kind] = (run["metrics"].get(key), run["num_turns"])
    assert counted == {kind: (1, 4) for kind in CALLERS}, counted


@pytest.mark.parametrize("kind", ["tool_agent", "audited", "gateway_agent"])
def test_the_three_loops_count_and_mask_stale_tokens_alike(tiny_qwen3_dir: Path, stamped: Any, tmp_path: Path, kind):
    """``verl_ext.max_token_lag: 0`` with every turn served on label 1 and trained at step 3 (lag 1): each loop hands
    verl a sample with every sampled token masked out and reports the same ``tito/async/*`` counts. One place does it
    for the three (``LiveRollout.trainer_mask``); before, only verl_ext_tool_agent counted and masked, and the
    audited loop and verl_ext_gateway_agent trained the stale tokens and logged no ``tito/async/`` metric."""
    metrics_sink.drain()
    loop, _ = loop_of(kind, tiny_qwen3_dir, stamped, tmp_path, options={"max_token_lag": 0}, label=1)
    out = run_loop(loop, PROMPT, **ROW, harness_tools=loop_tool_schemas())
    m = {k: v for k, v in metrics_sink.drain().items() if k.startswith("tito/async/")}
    sampled = m.get("tito/async/versioned_tokens", 0)
    assert sampled > 0 and m["tito/async/turns"] == 2 and m["tito/async/tokens_lag_1"] == sampled, (kind, m)
    assert m["tito/async/masked_stale_tokens"] == sampled and m["tito/async/staleness_mean"] == 1, (kind, m)
    assert sum(out.response_mask) == 0, (kind, out.response_mask)  # every sampled token was one version too old
    (record,) = [
        json.loads(x) for f in tmp_path.glob("*.jsonl") for x in f.read_text().splitlines() if '"rollout"' in x
    ]
    assert sum(record["loss_mask"]) == sampled  # the record keeps the sampled mask: the check judged that one
    assert sampled == sum(len(stamped.encode(t, add_special_tokens=False)) for t in TURNS)  # the same in each loop
    assert m["tito/async/unstamped_tokens"] == 0 and m["tito/async/resumes"] == 0, (kind, m)
