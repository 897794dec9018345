"""A gateway built from local folders: the model on the CPU engine (or another engine, e.g. a running SGLang
server), its tokenizer and chat template, records."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from verl_ext.core.errors import OptionsError, TemplateError
from verl_ext.core.images import ImageTokens
from verl_ext.core.rendering import ChatRenderer, load_renderer
from verl_ext.gateway.cpu_engine import CPUEngine
from verl_ext.gateway.engine import Engine
from verl_ext.gateway.parsing import ToolCallReader, reasoning_markers
from verl_ext.gateway.service import Gateway, GatewayConfig
from verl_ext.runtime import RolloutRuntime
from verl_ext.runtime.images import load_processor, vision_for


def local_gateway(
    model_dir: str | os.PathLike[str],
    *,
    tokenizer_dir: str | os.PathLike[str] | None = None,
    records_dir: str | os.PathLike[str] | None = None,
    thumbnails: bool = True,
    config: GatewayConfig | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    tool_parser: str = "hermes",
    seed: int = 0,
    engine: Engine | None = None,
    renderer: ChatRenderer | None = None,
    processor: Any = None,
) -> Gateway:
    """The gateway serving ``model_dir`` on the CPU engine (or on ``engine``, which serves that model: then its
    weights are not loaded), with the tokenizer of ``tokenizer_dir`` (default: the model's folder). Raises
    ``TemplateError`` when the chat template's verdict is unsupported (run ``verl-ext check-template`` for the
    audit), errors naming the folder when one cannot be loaded. ``renderer``: one loaded already (the CLI's, with
    its ``--chat-template``), instead of ``tokenizer_dir`` and ``template_kwargs``. ``processor``: a VL model's
    processor built already (else it is loaded from the model folder where that holds an image processor's
    settings); without one, images are refused with the cause (``gateway_vision``). ``thumbnails``: with records, a
    thumbnail per distinct image beside them (``verl_ext.telemetry.thumbnails``)."""
    if renderer is None:
        renderer = load_renderer(tokenizer_dir or model_dir, template_kwargs=template_kwargs)
    runtime = RolloutRuntime.build(
        renderer, records_dir=records_dir, records_prefix="gateway", thumbnails=thumbnails, who="verl-ext gateway"
    )
    reader = ToolCallReader(renderer.tokenizer, tool_parser)
    if engine is None:
        engine = CPUEngine(str(model_dir), seed=seed)
    vision, no_images = gateway_vision(model_dir, renderer, engine, processor)
    markers = reasoning_markers(renderer.tokenizer)
    return Gateway(engine, runtime, reader, config, markers=markers, vision=vision, no_images=no_images)


def gateway_vision(
    model_dir: str | os.PathLike[str], renderer: ChatRenderer, engine: Engine, processor: Any = None
) -> tuple[ImageTokens | None, str]:
    """The probed image side of the served model (``verl_ext.runtime.images.vision_for``), or None and why images
    are refused: a text-only model, an engine that takes no images, a processor that cannot be built
    (``load_processor``), a template the probe cannot serve."""
    has_processor = (Path(model_dir) / "preprocessor_config.json").is_file()
    if processor is None and not has_processor:
        return None, f"the served model is text-only (no preprocessor_config.json in {model_dir})"
    if not getattr(engine, "takes_images", False):
        return None, f"the gateway's engine ({type(engine).__name__}) takes no images"
    if processor is None:
        try:
            processor = load_processor(model_dir).processor
        except OptionsError as exc:
            return None, f"its images cannot be expanded: {exc}"
    try:
        vision = vision_for(processor, renderer)
    except TemplateError as exc:
        return None, f"the model's processor and chat template cannot serve images: {exc}"
    if vision is None:
        return None, "the model's processor has no image processor"
    return vision, ""


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
