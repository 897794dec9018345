"""Two gateway sessions served on the CPU engine (tiny random Qwen3, the real Qwen3 tokenizer, scripted turns) and
recorded: one whose harness edits its history (a changed question, then a retried tool result), one that never
forks. The report's fork and loop tests read the records (conftest's ``gateway_records``, ``standalone_records``)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))
from gateway_fixtures import CALL, TOOLS, Script  # noqa: E402

ANSWER = "<think>\nThe tool said %s.\n</think>\n\nThe answer is %s.<|im_end|>"
QUESTION = [{"role": "system", "content": "Use the calculator."}, {"role": "user", "content": "What is 6*7?"}]


def _call_message(call_id: str = "c00000000") -> dict[str, Any]:
    call = {"id": call_id, "type": "function", "function": {"name": "calc", "arguments": '{"expression":"6*7"}'}}
    return {"role": "assistant", "content": "", "tool_calls": [call]}


def serve_sessions(tiny_qwen3_dir: Path, renderer: Any, folder: Path, trained: bool) -> Path:
    """The two sessions served and recorded into ``folder``; ``trained``: the edited session is ended as
    verl_ext_gateway_agent ends it (branches=all, each record says what it trains), else as ``verl-ext gateway``
    ends every session (no trainer)."""
    from verl_ext.core.probe import probe_template
    from verl_ext.gateway.cpu_engine import CPUEngine
    from verl_ext.gateway.parsing import ToolCallReader, reasoning_markers
    from verl_ext.gateway.request import parse_chat_request
    from verl_ext.gateway.service import Gateway
    from verl_ext.gateway.training import plan_training
    from verl_ext.runtime import RolloutRuntime
    from verl_ext.telemetry.records import RecordWriter, header_record

    tokenizer = renderer.tokenizer
    profile = probe_template(renderer)
    script = Script(tokenizer)
    script.turns = [CALL % "6*7", ANSWER % (42, 42)]
    writer = RecordWriter(folder, header_record(profile), prefix="gateway")
    engine = CPUEngine(str(tiny_qwen3_dir), teacher_force=script)
    reader = ToolCallReader(tokenizer, "hermes")
    runtime = RolloutRuntime.build(renderer).with_writer(writer)
    gateway = Gateway(engine, runtime, reader, markers=reasoning_markers(tokenizer))

    async def ask(session: str, messages: list[dict[str, Any]]) -> Any:
        body = {"messages": messages, "tools": TOOLS, "max_tokens": 48, "seed": 0}
        return await gateway.complete(session, parse_chat_request(body))

    async def sessions() -> None:
        await ask("edits", QUESTION)
        await ask("edits", [*QUESTION, _call_message(), {"role": "tool", "tool_call_id": "c00000000", "content": "42"}])
        edited = [QUESTION[0], {"role": "user", "content": "What is 6*7? Show your work."}]
        assert (await ask("edits", edited)).fork is not None  # branch 1: the question changed
        retried = [*QUESTION, _call_message(), {"role": "tool", "tool_call_id": "c00000000", "content": "41"}]
        assert (await ask("edits", retried)).fork is not None  # branch 2: the tool result changed
        await ask("plain", QUESTION)

    asyncio.run(sessions())
    if trained:
        gateway.end("edits", training=plan_training(gateway.sessions["edits"].branches, "all"))
    gateway.end_all()
    return writer.path
