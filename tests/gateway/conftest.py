"""Gateway fixtures: a tiny random Qwen3 model with the real Qwen3 tokenizer on verl_ext's CPU engine.

A random model never writes a tool call, so tests script each assistant turn's text and the engine teacher-forces
it (the CPU engine's TEST hook): the ids are the real tokenizer's, the logprobs the model's.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest


class Script:
    """Texts forced as assistant turns, by turn index (the number of assistant openings in the prompt, minus the
    generation prompt's); a turn with no text left is sampled freely."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.head = tokenizer.encode("<|im_start|>assistant", add_special_tokens=False)
        self.turns: list[str] = []
        self._ids: dict[str, list[int]] = {}

    def __call__(self, prompt: Sequence[int]) -> list[int]:
        n, h = 0, self.head
        for i in range(len(prompt) - len(h) + 1):
            if prompt[i] == h[0] and list(prompt[i : i + len(h)]) == h:
                n += 1
        turn = n - 1
        if turn >= len(self.turns):
            return []
        text = self.turns[turn]
        if text not in self._ids:
            self._ids[text] = self.tokenizer.encode(text, add_special_tokens=False)
        return self._ids[text]


CALL = '<tool_call>\n{"name": "calc", "arguments": {"expression": "%s"}}\n</tool_call><|im_end|>'
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {
                "type": "object",
                "properties": {"expression": {"type": "string"}},
                "required": ["expression"],
            },
        },
    }
]


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
    """``make_gateway(script_turns, **config)``: a fresh Gateway (records under tmp_path/records) on the shared
    engine, whose script is set to ``script_turns``."""
    from verl_ext.gateway.service import Gateway, GatewayConfig
    from verl_ext.telemetry.records import RecordWriter, header_record

    def make(turns: Sequence[str] = (), **config: Any) -> Any:
        parts = gateway_parts
        parts["script"].turns = list(turns)
        writer = RecordWriter(tmp_path / "records", header_record(parts["profile"]), prefix="gateway")
        return Gateway(
            parts["engine"],
            parts["renderer"],
            parts["profile"],
            parts["reader"],
            GatewayConfig(**config),
            writer=writer,
            markers=parts["markers"],
        )

    return make
