"""Through the gateway and the official OpenAI SDK, a DeepSeek V3 tool-call turn (DeepSeek V3's own template,
tests/fixtures/templates) comes back with exactly the content the template wrapped and the calls as sampled.

Issue 37: the reader derived from that template read the calls but left the section's close ``<｜tool▁calls▁end｜>``
in the content, which the client got as the message's content and the check flagged (``message_differs``) on every
tool-call turn. The template's markers are special tokens of a copy of the Qwen3 tokenizer
(``template_fixtures.template_renderer``); the engine is a tiny random Qwen3 model over that vocabulary on the CPU
engine, its turns teacher-forced.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import httpx
import openai
import pytest
from gateway_fixtures import TOOLS
from template_fixtures import template_renderer

from verl_ext.gateway.server import ServerThread, create_app

V3 = "deepseek-ai-DeepSeek-V3"
CALL = '<｜tool▁call▁begin｜>function<｜tool▁sep｜>calc\n```json\n{"expression": "%s"}\n```<｜tool▁call▁end｜>'
# Two calls as the template writes them, then its close and the turn's end (a model trained on it writes this).
TURN = f"<｜tool▁calls▁begin｜>{CALL % '6*7'}\n{CALL % '1+1'}<｜tool▁calls▁end｜><｜end▁of▁sentence｜>"
ANSWER = "The answer is 42.<｜end▁of▁sentence｜>"


class _Script:
    """The turns to force, one per engine call in order (V3's template writes no assistant header after tool
    results, so a turn cannot be told by the headers in its prompt)."""

    def __init__(self, tokenizer: Any, turns: Sequence[str]) -> None:
        self.turns = [tokenizer.encode(t, add_special_tokens=False) for t in turns]
        self.calls = 0

    def __call__(self, prompt: Sequence[int]) -> list[int]:
        self.calls += 1
        return list(self.turns[self.calls - 1]) if self.calls <= len(self.turns) else []


@pytest.fixture(scope="module")
def v3_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from verl_ext.core.probe import probe_template
    from verl_ext.demo.model import build_tiny_qwen3
    from verl_ext.gateway.cpu_engine import CPUEngine
    from verl_ext.gateway.parsing import ToolCallReader, reasoning_markers
    from verl_ext.gateway.service import Gateway
    from verl_ext.runtime import RolloutRuntime

    renderer = template_renderer(V3)
    folder = tmp_path_factory.mktemp("v3-tokenizer")
    renderer.tokenizer.save_pretrained(str(folder))
    model = build_tiny_qwen3(tmp_path_factory.mktemp("tiny-v3"), folder, seed=0)  # its vocabulary holds the markers
    # the engine stops on the model's eos, as a DeepSeek model's generation config names <｜end▁of▁sentence｜>
    from transformers import GenerationConfig

    eos = renderer.tokenizer.convert_tokens_to_ids("<｜end▁of▁sentence｜>")
    GenerationConfig(bos_token_id=eos, eos_token_id=[eos], pad_token_id=eos).save_pretrained(str(model))
    engine = CPUEngine(str(model), teacher_force=_Script(renderer.tokenizer, [TURN, ANSWER]))
    runtime = RolloutRuntime.build(renderer)
    assert probe_template(renderer).verdict.value != "unsupported"
    gateway = Gateway(
        engine, runtime, ToolCallReader(renderer.tokenizer, "hermes"), markers=reasoning_markers(renderer.tokenizer)
    )
    server = ServerThread(create_app(gateway, "tiny-v3")).start()
    yield gateway, server
    server.stop()


def test_a_deepseek_v3_tool_call_turn_carries_exactly_the_content_the_template_wrapped(v3_server: Any) -> None:
    gateway, server = v3_server
    sdk = openai.OpenAI(base_url=f"{server.url}/sessions/v3/v1", api_key="verl-ext", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "6*7 and 1+1?"}]
    response = sdk.chat.completions.create(model="tiny-v3", messages=messages, tools=TOOLS, max_tokens=96)
    message = response.choices[0].message
    assert response.choices[0].finish_reason == "tool_calls", message
    assert message.content in ("", None), message.content  # the template wrapped no content: none comes back
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls]
    assert calls == [("calc", {"expression": "6*7"}), ("calc", {"expression": "1+1"})]
    messages.append(message.model_dump(exclude_none=True))
    results = zip(message.tool_calls, ("42", "2"), strict=True)
    messages += [{"role": "tool", "tool_call_id": c.id, "content": r} for c, r in results]
    answer = sdk.chat.completions.create(model="tiny-v3", messages=messages, tools=TOOLS, max_tokens=32)
    assert answer.choices[0].message.content == "The answer is 42."
    summary = httpx.post(f"{server.url}/sessions/v3/end", timeout=60).json()
    (branch,) = summary["branches"]
    assert branch["engine_ok"] and branch["fork"] is None and branch["turns"] == 2, branch
    assert gateway.counters["forks"] == 0
    assert branch["ok"], branch  # no defect: the gateway keeps no result of an ended session, /end says it
