"""A gateway built from local folders: the model on the CPU engine (or another engine, e.g. a running SGLang
server), its tokenizer and chat template, records."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from verl_ext.core.errors import TemplateError
from verl_ext.core.probe import Severity, Verdict, probe_template
from verl_ext.core.rendering import load_renderer
from verl_ext.gateway.cpu_engine import CPUEngine
from verl_ext.gateway.engine import Engine
from verl_ext.gateway.parsing import ToolCallReader, reasoning_markers
from verl_ext.gateway.service import Gateway, GatewayConfig
from verl_ext.telemetry.records import RecordWriter, header_record


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
    profile = probe_template(renderer)
    if profile.verdict is Verdict.UNSUPPORTED:
        reasons = "; ".join(r.text for r in profile.reasons if r.severity is Severity.UNSUPPORTED)
        raise TemplateError(
            f"the chat template of {renderer.name!r} is unsupported: {reasons}. "
            f"Run `verl-ext check-template {renderer.name}` for the full audit."
        )
    reader = ToolCallReader(renderer.tokenizer, tool_parser)
    writer = None
    if records_dir is not None:
        writer = RecordWriter(records_dir, header_record(profile), prefix=f"gateway-{profile.fingerprint}")
    if engine is None:
        engine = CPUEngine(str(model_dir), seed=seed)
    markers = reasoning_markers(renderer.tokenizer)
    return Gateway(engine, renderer, profile, reader, config, writer=writer, markers=markers)
