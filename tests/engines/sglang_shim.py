"""Import SGLang 0.5.12 (and verl's SGLang server) on a CPU machine, for tests only.

SGLang is installed with ``--no-deps`` plus its light dependencies (Makefile ``sglang-cpu``); three things it imports
at module level do not exist on CPU, and are stood in for while SGLang's modules import:

* ``triton``: SGLang's own stub for machines without it (``sglang/_triton_stub.py``), loaded from its file so the
  package ``__init__`` does not run first; ``torch._inductor`` is imported before, so torch never sees the stub;
* ``torchvision`` and ``sgl_kernel``: import-only modules (any attribute is a stand-in; nothing in them is called by
  the token path). PyPI's torchvision is CUDA-built and fails against CPU torch; sgl_kernel is CUDA-only. The
  torchvision stand-in is removed from ``sys.modules`` afterwards, so transformers keeps seeing no torchvision;
* transformers' placeholders for classes needing torchvision (``AutoImageProcessor``) get a no-op ``register`` while
  SGLang registers its multimodal image processors at import; the token path never uses them.

Nothing of SGLang's GPU stack runs: the tests drive SGLang's request, sampling-parameter, finish and output code.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

_STUB_ROOTS = ("torchvision", "sgl_kernel")
_MODULES = (
    "sglang.srt.managers.io_struct",
    "sglang.srt.managers.schedule_batch",
    "sglang.srt.sampling.sampling_params",
    "sglang.srt.managers.tokenizer_manager",
    "verl.workers.rollout.sglang_rollout.async_sglang_server",
)
# SGLang's multimodal processors (Qwen-VL's imports torchvision at module level): only the image tests need them
_VL_MODULES = ("sglang.srt.multimodal.processors.qwen_vl",)
_loaded: set[str] = set()


def sglang_installed() -> bool:
    return importlib.util.find_spec("sglang") is not None


def _triton_stub() -> ModuleType:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.submodule_search_locations
    path = os.path.join(list(spec.submodule_search_locations)[0], "_triton_stub.py")
    loader_spec = importlib.util.spec_from_file_location("verl_ext_tests_sglang_triton_stub", path)
    assert loader_spec is not None and loader_spec.loader is not None
    module = importlib.util.module_from_spec(loader_spec)
    loader_spec.loader.exec_module(module)
    return module


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, stub_module_class: type) -> None:
        self.stub_module_class = stub_module_class

    def find_spec(self, name: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name.split(".")[0] in _STUB_ROOTS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.stub_module_class(spec.name)

    def exec_module(self, module: ModuleType) -> None:
        return None


def _no_registration(*args: Any, **kwargs: Any) -> None:
    """SGLang registers multimodal image processors at import; without torchvision transformers has only a
    placeholder to register them with, and the token path never uses them."""
    return None


def load_sglang(*, vl: bool = False) -> None:
    """Import SGLang's token-path modules and verl's SGLang server once per process (``vl``: and SGLang's Qwen-VL
    multimodal processor)."""
    wanted = [m for m in (*_MODULES, *(_VL_MODULES if vl else ())) if m not in _loaded]
    if not wanted:
        return
    # transformers modules that ask "is torchvision installed?" at import time: answer before the stand-in exists
    for name in (
        "torch._inductor.compile_fx",
        "transformers.image_utils",
        "transformers.processing_utils",
        "transformers.modeling_utils",
        "transformers.video_utils",
        "transformers.image_processing_utils_fast",
        "transformers.image_processing_utils",
    ):
        importlib.import_module(name)
    stub = _triton_stub()
    stub.install()
    finder = _StubFinder(stub._MockModule)
    sys.meta_path.insert(0, finder)
    _forget_torchvision_answer()
    from transformers.utils.import_utils import DummyObject

    dummy_getattribute = DummyObject.__getattribute__

    def registering_getattribute(cls: Any, key: str) -> Any:
        return _no_registration if key == "register" else dummy_getattribute(cls, key)

    DummyObject.__getattribute__ = registering_getattribute  # type: ignore[method-assign]
    try:
        for name in wanted:
            importlib.import_module(name)
            _loaded.add(name)
    finally:
        DummyObject.__getattribute__ = dummy_getattribute  # type: ignore[method-assign]
        sys.meta_path.remove(finder)
        for name in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        _forget_torchvision_answer()


def _forget_torchvision_answer() -> None:
    """transformers caches whether torchvision is installed; it is asked again with and without the stand-in."""
    from transformers.utils import import_utils

    for name in ("is_torchvision_available", "is_torchvision_v2_available"):
        cached = getattr(import_utils, name, None)
        if hasattr(cached, "cache_clear"):
            cached.cache_clear()
