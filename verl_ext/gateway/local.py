"""A gateway built from local folders: the model on the CPU engine (or another engine, e.g. a running SGLang
server), its tokenizer and chat template, records."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from verl_ext.core.rendering import load_renderer
from verl_ext.gateway.cpu_engine import CPUEngine
from verl_ext.gateway.engine import Engine
from verl_ext.gateway.parsing import ToolCallReader, reasoning_markers
from verl_ext.gateway.service import Gateway, GatewayConfig
from verl_ext.runtime import RolloutRuntime


def local_gateway(
    model_dir: str | os.PathLike[str],
    *,
    tokenizer_dir: str | os.PathLike[str] | None = None,
    records_dir: str | os.PathLike[str] | None = None,
    config: GatewayConfig | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    tool_parser: str = "hermes",
    seed: int = 0,
    engine: Engine | None = None,
) -> Gateway:
    """The gateway serving ``model_dir`` on the CPU engine (or on ``engine``, which serves that model: then its
    weights are not loaded), with the tokenizer of ``tokenizer_dir`` (default: the model's folder). Raises
    ``TemplateError`` when the chat template's verdict is unsupported (run ``verl-ext check-template`` for the
    audit), errors naming the folder when one cannot be loaded."""
    renderer = load_renderer(tokenizer_dir or model_dir, template_kwargs=template_kwargs)
    runtime = RolloutRuntime.build(renderer, records_dir=records_dir, records_prefix="gateway", who="verl-ext gateway")
    reader = ToolCallReader(renderer.tokenizer, tool_parser)
    if engine is None:
        engine = CPUEngine(str(model_dir), seed=seed)
    return Gateway(engine, runtime, reader, config, markers=reasoning_markers(renderer.tokenizer))
