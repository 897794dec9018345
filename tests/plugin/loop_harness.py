"""In-process verl agent-loop harness: verl's composed config, the CPU engine without Ray, verl's tool loader.

The ``make_loop`` fixture is re-exported by conftest.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO_TOOLS = REPO / "verl_ext" / "demo" / "tools.py"


def verl_config(overrides: list[str]) -> Any:
    """verl's own ppo_trainer.yaml, composed with Hydra as main_ppo does, plus overrides."""
    import verl.trainer
    from hydra import compose, initialize_config_dir

    config_dir = str(Path(verl.trainer.__file__).parent / "config")
    with initialize_config_dir(config_dir=config_dir, version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides)


class RecordingServer:
    """verl's server-manager interface over an in-process CPUGenerationServer; records what each call asked for."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.requests: list[dict[str, Any]] = []
        self.acquired: list[str] = []
        self.released: list[str | None] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **_: Any):
        request = {"prompt_ids": list(prompt_ids), "sampling_params": dict(sampling_params)}
        self.requests.append(request)
        output = await self.server.generate(prompt_ids, sampling_params, request_id)
        request["output_ids"] = list(output.token_ids)
        return output

    # verl's LLMServerClient routing, as the re-feed audit calls it (plugin/refeed_loop.py): one server here
    async def _acquire_server(self, request_id: str, **_: Any) -> tuple[str, Any]:
        self.acquired.append(request_id)
        return f"cpu-{id(self.server)}", self.server  # a server id is unique in verl's pool

    def _release_server(self, server_id: str, request_id: str | None = None) -> None:
        self.released.append(request_id)


@pytest.fixture
def make_loop(tiny_qwen3_dir: Path) -> Callable[..., tuple[Any, RecordingServer]]:
    """``make_loop(force_text=..., response_length=..., verl_ext=..., stock=..., faults=...)`` -> (loop, server).

    ``stock=True`` gives verl's own ``tool_agent`` with verl_ext's audit-only check around it."""
    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap
    from verl.utils.dataset.rl_dataset import RLHFDataset

    from verl_ext.engines.cpu import CPUGenerationServer
    from verl_ext.plugin.agent_loop import VerlExtToolAgentLoop
    from verl_ext.plugin.audit_loop import AuditedToolAgentLoop

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_qwen3_dir))

    def make(
        force_text: str | None = None,
        response_length: int = 96,
        verl_ext: dict[str, Any] | None = None,
        tools_path: Path = DEMO_TOOLS,
        extra: list[str] = (),
        stock: bool = False,
        faults: list[dict[str, Any]] | None = None,
    ) -> tuple[Any, RecordingServer]:
        cfg = verl_config(
            [
                f"actor_rollout_ref.model.path={tiny_qwen3_dir}",
                "actor_rollout_ref.rollout.multi_turn.enable=true",
                "actor_rollout_ref.rollout.multi_turn.format=hermes",
                *(
                    []
                    if any("max_assistant_turns" in o for o in extra)
                    else ["actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3"]
                ),
                "actor_rollout_ref.rollout.prompt_length=512",
                f"actor_rollout_ref.rollout.response_length={response_length}",
                *extra,
            ]
        )
        tools = load_tools(tools_path)
        server = RecordingServer(
            CPUGenerationServer(
                str(tiny_qwen3_dir),
                prompt_length=512,
                response_length=response_length,
                force_text=force_text,
                faults=faults,
            )
        )
        loop_class = AuditedToolAgentLoop if stock else VerlExtToolAgentLoop
        loop = loop_class(
            trainer_config=DictConfigWrap(cfg),
            server_manager=server,
            tokenizer=tokenizer,
            processor=None,
            dataset_cls=RLHFDataset,
            data_config=DictConfigWrap(cfg.data),
            tools=ToolListWrap(tools),
            hf_model_type="qwen3",  # as verl's worker passes it: the stock loop then gets its Qwen3 token builder
            verl_ext=verl_ext,
        )
        return loop, server

    return make


_TOOL_CACHE: dict[str, list[Any]] = {}


def load_tools(path: Path) -> list[Any]:
    """verl's function-tool loader, once per file (verl refuses to register a tool name twice)."""
    from verl.tools.function_tool import load_function_tools_from_path

    if str(path) not in _TOOL_CACHE:
        _TOOL_CACHE[str(path)] = load_function_tools_from_path(str(path))
    return _TOOL_CACHE[str(path)]


def run_loop(loop: Any, prompt: list[dict[str, Any]], stop_token_ids: list[int] = (), **kwargs: Any) -> Any:
    params = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    if stop_token_ids:
        params["stop_token_ids"] = list(stop_token_ids)
    # verl's loops bind the event loop current at construction (run_in_executor on it), as its worker does
    return loop.loop.run_until_complete(loop.run(params, raw_prompt=prompt, **kwargs))
