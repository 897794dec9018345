"""A Qwen2.5-VL processor and a tiny random Qwen2.5-VL model, built offline from files in the repository.

The fixture folder (``tests/fixtures/vl/qwen2.5-vl``, its README states where each setting comes from) holds the
VL chat template (images, tools, tool calls, tool responses that may hold images), the image processor's settings
and the tiny model's config; the tokenizer is the real Qwen2.5 one shipped with the tests. Nothing is downloaded.

Test/demo-side only: transformers' ``Qwen2_5_VLProcessor`` insists on a video processor that is an instance of
``transformers.BaseVideoProcessor``, and without torchvision (which cannot be installed beside torch 2.13 CPU) that
public name is a placeholder class and the real video processor refuses to build. ``build_vl_processor`` therefore
hands it transformers' own base video processor class, read from its module, for the length of one constructor
call (``verl_ext.runtime.images.video_processor_stand_in``); images never touch it, and a video would be refused
by the loop anyway.
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

from verl_ext.runtime.images import video_processor_stand_in

REPO = Path(__file__).resolve().parents[2]
VL_FIXTURE = REPO / "tests" / "fixtures" / "vl" / "qwen2.5-vl"
REMOTE_PROCESSOR_MODULE = "processing_verl_ext_vl"  # the saved model folder's remote-code processor module


def vl_fixture_files(fixture_dir: str | Path = VL_FIXTURE) -> dict[str, Path]:
    """The fixture's files by role: ``chat_template``, ``preprocessor``, ``model_config``."""
    folder = Path(fixture_dir)
    return {
        "chat_template": folder / "chat_template.jinja",
        "preprocessor": folder / "preprocessor_config.json",
        "model_config": folder / "model_config.json",
    }


def build_vl_processor(tokenizer_dir: str | Path, fixture_dir: str | Path = VL_FIXTURE) -> Any:
    """A ``Qwen2_5_VLProcessor``: the tokenizer in ``tokenizer_dir``, the image processor
    (``Qwen2VLImageProcessorPil``) with the fixture's settings, the fixture's VL chat template; ``config`` and
    ``get_rope_index`` bound the way verl's ``hf_processor`` binds them (else verl's worker silently computes 1D
    positions for an mrope model)."""
    from transformers import AutoTokenizer, Qwen2_5_VLConfig, Qwen2_5_VLProcessor, Qwen2VLImageProcessorPil
    from transformers.models.qwen2_5_vl import Qwen2_5_VLModel

    files = vl_fixture_files(fixture_dir)
    settings = json.loads(files["preprocessor"].read_text())
    image_processor = Qwen2VLImageProcessorPil(
        **{k: v for k, v in settings.items() if k not in ("image_processor_type", "processor_class")}
    )
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    template = files["chat_template"].read_text()
    with video_processor_stand_in() as video_cls:
        processor = Qwen2_5_VLProcessor(
            image_processor=image_processor, tokenizer=tokenizer, video_processor=video_cls(), chat_template=template
        )
    tokenizer.chat_template = template  # the loop renders with the tokenizer's template: the same one
    processor.config = Qwen2_5_VLConfig(**json.loads(files["model_config"].read_text()))
    processor.get_rope_index = types.MethodType(Qwen2_5_VLModel.get_rope_index, processor)
    if hasattr(Qwen2_5_VLModel, "get_vision_position_ids"):
        processor.get_vision_position_ids = types.MethodType(Qwen2_5_VLModel.get_vision_position_ids, processor)
    return processor


def build_tiny_vl_model(fixture_dir: str | Path = VL_FIXTURE, seed: int = 0) -> Any:
    """A randomly initialised ``Qwen2_5_VLForConditionalGeneration`` (fp32, eval mode) from the fixture's config:
    about 20M parameters, almost all of them the embedding. It writes noise; it exists so the image path runs end
    to end on CPU."""
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(seed)
    config = Qwen2_5_VLConfig(**json.loads(vl_fixture_files(fixture_dir)["model_config"].read_text()))
    return Qwen2_5_VLForConditionalGeneration(config).eval()


def save_tiny_vl_model(out_dir: str | Path, tokenizer_dir: str | Path, fixture_dir: str | Path = VL_FIXTURE) -> Path:
    """Save the tiny model and its processor's files (``save_vl_processor_files``) in ``out_dir``: a model folder
    verl's config can name (``model_type`` ``qwen2_5_vl``; with ``trust_remote_code``, verl builds its processor)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    build_tiny_vl_model(fixture_dir).save_pretrained(str(out))
    return save_vl_processor_files(out, tokenizer_dir, fixture_dir)


def save_vl_processor_files(
    out_dir: str | Path, tokenizer_dir: str | Path, fixture_dir: str | Path = VL_FIXTURE
) -> Path:
    """The tokenizer (with the VL template), the processor's settings and the remote-code processor in ``out_dir``.

    verl builds its processor with ``AutoProcessor.from_pretrained(folder, trust_remote_code=...)``; the folder's
    ``processor_config.json`` names ``vl_processing.py``'s class (copied in), which builds it without torchvision
    (that module's docstring says why)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = vl_fixture_files(fixture_dir)
    processor = build_vl_processor(tokenizer_dir, fixture_dir)
    processor.tokenizer.save_pretrained(str(out))
    (out / "preprocessor_config.json").write_text(files["preprocessor"].read_text())
    (out / "chat_template.jinja").write_text(files["chat_template"].read_text())
    (out / f"{REMOTE_PROCESSOR_MODULE}.py").write_text((Path(__file__).parent / "vl_processing.py").read_text())
    (out / "processor_config.json").write_text(
        json.dumps({"auto_map": {"AutoProcessor": f"{REMOTE_PROCESSOR_MODULE}.Qwen2_5_VLProcessor"}}, indent=2) + "\n"
    )
    return out
