"""Gateway fixtures: a tiny random Qwen3 model with the real Qwen3 tokenizer on verl_ext's CPU engine.

A random model never writes a tool call, so tests script each assistant turn's text and the engine teacher-forces
it (the CPU engine's TEST hook): the ids are the real tokenizer's, the logprobs the model's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from gateway_fixtures import Script
from replay_checks import assert_records_replay


@pytest.fixture(scope="session")
def gateway_parts(tiny_qwen3_dir: Path) -> dict[str, Any]:
    """The tokenizer, renderer, profile, tool reader and the CPU engine with a settable script, built once."""
    from transformers import AutoTokenizer

    from verl_ext.core.probe import probe_template
    from verl_ext.core.rendering import ChatRenderer
    from verl_ext.gateway.cpu_engine import CPUEngine
    from verl_ext.gateway.parsing import ToolCallReader, reasoning_markers

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))
    renderer = ChatRenderer(tokenizer)
    script = Script(tokenizer)
    return {
        "tokenizer": tokenizer,
        "renderer": renderer,
        "profile": probe_template(renderer),
        "reader": ToolCallReader(tokenizer, "hermes"),
        "markers": reasoning_markers(tokenizer),
        "engine": CPUEngine(str(tiny_qwen3_dir), teacher_force=script),
        "script": script,
        "model_dir": tiny_qwen3_dir,
    }


@pytest.fixture
def make_gateway(gateway_parts: dict[str, Any], tmp_path: Path) -> Any:
    """``make_gateway(script_turns, *, renderer=None, replay=True, **config)``: a fresh Gateway (records under
    tmp_path/records) on the shared engine, whose script is set to ``script_turns``, serving ``renderer`` (default:
    the tiny model's). After the test, every record it wrote must replay to what was trained (``replay_checks``),
    unless ``replay`` is False (a test of thousands of sessions, whose replays prove nothing the others do not)."""
    from verl_ext.gateway.service import Gateway, GatewayConfig
    from verl_ext.runtime import RolloutRuntime
    from verl_ext.telemetry.records import RecordWriter, header_record

    replays: list[Any] = []

    def make(turns: Sequence[str] = (), *, renderer: Any = None, replay: bool = True, **config: Any) -> Any:
        parts = gateway_parts
        parts["script"].turns = list(turns)
        runtime = RolloutRuntime.build(renderer or parts["renderer"])
        writer = RecordWriter(tmp_path / "records", header_record(runtime.profile), prefix="gateway")
        if replay:
            replays.append(runtime.renderer)
        runtime = runtime.with_writer(writer)
        return Gateway(parts["engine"], runtime, parts["reader"], GatewayConfig(**config), markers=parts["markers"])

    yield make
    for renderer in dict.fromkeys(replays):
        assert_records_replay(tmp_path / "records", renderer)
