"""Remote code for the tiny VL demo model's folder: lets ``AutoProcessor.from_pretrained(folder,
trust_remote_code=True)`` (what verl's ``hf_processor`` calls) build the Qwen2.5-VL processor where transformers
cannot, because torchvision is missing (it cannot be installed beside torch 2.13 CPU, and transformers' Qwen2.5-VL
processor insists on a video processor, which needs it).

``save_tiny_vl_model`` copies this file into the model folder as ``processing_verl_ext_vl.py`` and names it in
``processor_config.json``'s ``auto_map``. The processor it returns is transformers' own ``Qwen2_5_VLProcessor``
(verl binds ``get_rope_index`` by that class name) with the folder's image processor and tokenizer; only the video
processor is transformers' base class standing in (images never touch it; verl_ext refuses videos). A real
Qwen2.5-VL folder needs none of this: on a machine with torchvision transformers builds it itself.
"""

from __future__ import annotations

from typing import Any

import transformers


class Qwen2_5_VLProcessor(transformers.Qwen2_5_VLProcessor):  # noqa: N801  (transformers' class name: verl matches it)
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: Any, *args: Any, **kwargs: Any) -> Any:
        from verl_ext.runtime.images import processor_from_parts

        return processor_from_parts(pretrained_model_name_or_path)
