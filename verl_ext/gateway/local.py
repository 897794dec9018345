"""A gateway built from local folders: the model on the CPU engine (or another engine, e.g. a running SGLang
server), its tokenizer and chat template, records."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_ext.core.errors import OptionsError
from verl_ext.core.rendering import ChatRenderer, load_renderer
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
    renderer: ChatRenderer | None = None,
) -> Gateway:
    """The gateway serving ``model_dir`` on the CPU engine (or on ``engine``, which serves that model: then its
    weights are not loaded), with the tokenizer of ``tokenizer_dir`` (default: the model's folder). Raises
    ``TemplateError`` when the chat template's verdict is unsupported (run ``verl-ext check-template`` for the
    audit), errors naming the folder when one cannot be loaded. ``renderer``: one loaded already (the CLI's, with
    its ``--chat-template``), instead of ``tokenizer_dir`` and ``template_kwargs``."""
    if renderer is None:
        renderer = load_renderer(tokenizer_dir or model_dir, template_kwargs=template_kwargs)
    runtime = RolloutRuntime.build(renderer, records_dir=records_dir, records_prefix="gateway", who="verl-ext gateway")
    reader = ToolCallReader(renderer.tokenizer, tool_parser)
    if engine is None:
        engine = CPUEngine(str(model_dir), seed=seed)
    return Gateway(engine, runtime, reader, config, markers=reasoning_markers(renderer.tokenizer))


def check_tokenizer_matches(
    model_dir: str | os.PathLike[str], renderer: ChatRenderer, tokenizer_dir: str | os.PathLike[str] | None
) -> None:
    """Refuse a tokenizer that is not the model's where its ``config.json`` shows it (read before the weights):
    more ids than the model's vocabulary, or end-of-sequence ids the tokenizer does not have. The engine would
    sample ids the tokenizer reads as other text, and every answer would be garbage or empty."""
    config_file = Path(model_dir) / "config.json"
    if not config_file.is_file():
        return
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError):
        return  # the engine's load names a damaged config
    config = config.get("text_config", config) if isinstance(config, dict) else {}
    vocab = config.get("vocab_size")
    eos = config.get("eos_token_id")
    eos_ids = [e for e in (eos if isinstance(eos, list) else [eos]) if isinstance(e, int)]
    size = renderer.vocab_size
    given = f"--tokenizer {tokenizer_dir}" if tokenizer_dir else f"the tokenizer of {model_dir}"
    if isinstance(vocab, int) and size > vocab:
        problem = f"it has {size:,} ids and the model's vocabulary {vocab:,}"
    elif eos_ids and any(e >= size for e in eos_ids):
        problem = f"the model's end-of-sequence ids {eos_ids} are past its {size:,} ids"
    else:
        return
    raise OptionsError(
        f"{given} is not the tokenizer of the model in {model_dir}: {problem}. Pass the model's own tokenizer "
        "folder as --tokenizer (or leave it out to use the model folder's)"
    )
