"""A CPU platform for verl 0.9.1, so its real trainer runs on a machine without an accelerator (tests, demos).

Activated by ``VERL_PLATFORM=cpu`` (verl's own platform override). Three things are needed besides the platform
class itself, each found by running ``python -m verl.trainer.main_ppo`` on CPU (see docs/cpu-engine.md):

* verl builds the process-group backend as ``f"cpu:gloo,{device}:{backend}"``, which on CPU is
  ``"cpu:gloo,cpu:gloo"`` and torch rejects duplicate device types: ``init_process_group`` is wrapped to dedupe it.
* verl's FSDP training engines are registered for ``["cuda", "npu"]`` only; they are plain torch code and run on
  CPU, so they are registered for ``"cpu"`` too (lazily, at the first engine lookup, to keep plugin import cheap).
* ``get_device_id()`` is passed to ``Tensor.to``; an integer there means a CUDA device, so ours is ``"cpu"``.

Ray still needs an accelerator resource, because verl's resource pools always ask for GPUs: the platform names Ray's
``"GPU"`` resource and the run declares fake ones (``+ray_kwargs.ray_init.num_gpus=1``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import types
from collections.abc import Iterator
from typing import Any

import torch
from verl.plugin.platform import PlatformBase, PlatformRegistry

logger = logging.getLogger(__name__)

PLATFORM_NAME = "cpu"


def _total_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _available_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


class CPUDeviceModule(types.ModuleType):
    """Stands in for ``torch.cuda`` where verl calls ``get_torch_device().<fn>``.

    Memory and cache calls are no-ops or host-memory figures; anything else is taken from ``torch.cpu``
    (``Stream``, ``current_stream``, ``synchronize``, ...), so a missing name fails with a clear AttributeError.
    """

    def __init__(self) -> None:
        super().__init__("verl_ext_cpu_device")

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cpu, name)

    @staticmethod
    def is_available() -> bool:
        """``torch.cuda.is_available`` for the CPU: always True."""
        return True

    @staticmethod
    def device_count() -> int:
        """One device: the process's CPU."""
        return 1

    @staticmethod
    def current_device() -> str:
        """The torch device name ``"cpu"`` (an int would mean ``cuda:<int>`` to verl)."""
        return "cpu"

    @staticmethod
    def set_device(device: Any) -> None:
        """Nothing to select on CPU."""
        return None

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        """``"cpu"``, as verl logs it."""
        return "cpu"

    @staticmethod
    def synchronize(device: Any = None) -> None:
        """Nothing to wait for: CPU ops are synchronous."""
        return None

    @staticmethod
    def empty_cache() -> None:
        """No device cache on CPU."""
        return None

    @staticmethod
    def ipc_collect() -> None:
        """No CUDA IPC handles on CPU."""
        return None

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        """No device memory pool to cap on CPU."""
        return None

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        """(available, total) system memory in bytes, as ``torch.cuda.mem_get_info`` gives a GPU's."""
        return _available_memory_bytes(), _total_memory_bytes()

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        """0: there is no device allocator to count on CPU."""
        return 0

    @staticmethod
    def memory_reserved(device: Any = None) -> int:
        """0: there is no device allocator to count on CPU."""
        return 0

    @staticmethod
    def max_memory_allocated(device: Any = None) -> int:
        """0: there is no device allocator to count on CPU."""
        return 0

    @staticmethod
    def max_memory_reserved(device: Any = None) -> int:
        """0: there is no device allocator to count on CPU."""
        return 0

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        """No device peaks to reset on CPU."""
        return None

    @staticmethod
    def get_rng_state(device: Any = None) -> torch.Tensor:
        """The CPU generator's state (torch's default generator)."""
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: Any = None) -> None:
        """Restore the CPU generator's state."""
        torch.set_rng_state(state)

    @staticmethod
    def manual_seed(seed: int) -> None:
        """Seed torch's CPU generator."""
        torch.manual_seed(seed)

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        """Seed torch's CPU generator (there is one device)."""
        torch.manual_seed(seed)


_DEVICE_MODULE = CPUDeviceModule()


class CPUPlatform(PlatformBase):
    """verl platform for plain CPUs: torch device ``cpu``, collectives on gloo."""

    @property
    def device_name(self) -> str:
        """The torch device type verl moves tensors to: ``"cpu"``."""
        return "cpu"

    @property
    def vendor_name(self) -> str:
        """The vendor verl logs: ``"cpu"``."""
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        """The ``torch.cuda``-like module verl calls (``CPUDeviceModule``)."""
        return _DEVICE_MODULE

    def is_available(self) -> bool:
        """The CPU is always there."""
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        """False: the platform is chosen only by ``VERL_PLATFORM=cpu``, never detected."""
        # Never auto-detected: only VERL_PLATFORM=cpu selects it, so a GPU host is never silently run on CPU.
        return False

    def current_device(self) -> str:  # type: ignore[override]
        """The torch device ``"cpu"`` (verl passes it to ``Tensor.to``)."""
        # verl passes this to Tensor.to / torch.device; an int would mean cuda:<int>.
        return "cpu"

    def device_count(self) -> int:
        """One device: the process's CPU."""
        return 1

    def set_device(self, device_index: Any) -> None:
        """Nothing to select on CPU."""
        return None

    def synchronize(self, device_index: Any = None) -> None:
        """Nothing to wait for: CPU ops are synchronous."""
        return None

    def manual_seed(self, seed: int) -> None:
        """Seed torch's CPU generator."""
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        """Seed torch's CPU generator (there is one device)."""
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        """No device allocator to configure on CPU."""
        return None

    def empty_cache(self) -> None:
        """No device cache on CPU."""
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        """(None, None): a CPU has no compute capability."""
        return None, None

    def communication_backend_name(self) -> str:
        """Collectives run on gloo."""
        return "gloo"

    def visible_devices_envvar(self) -> str:
        """``CUDA_VISIBLE_DEVICES``: what Ray sets for the fake GPUs verl's pools ask for."""
        # Ray sets CUDA_VISIBLE_DEVICES for the fake GPUs the pools ask for; verl's workers read it back.
        return "CUDA_VISIBLE_DEVICES"

    @contextlib.contextmanager
    def nvtx_range(self, msg: str) -> Iterator[None]:
        """No profiler ranges on CPU: a context that does nothing."""
        yield

    def profiler_start(self) -> None:
        """No device profiler on CPU."""
        return None

    def profiler_stop(self) -> None:
        """No device profiler on CPU."""
        return None

    def ray_resource_name(self) -> str:
        """``"GPU"``: verl's pools always request accelerators; on CPU they are Ray's fake GPUs."""
        # verl's resource pools always request accelerators; on CPU they are Ray's fake "GPU" resources.
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        """No environment variable tells Ray to leave device visibility alone on CPU."""
        return []

    def is_ipc_supported(self) -> bool:
        """False: no CUDA IPC between CPU processes (weights go by value)."""
        return False

    def cudart(self) -> Any:
        """None: there is no CUDA runtime."""
        return None


def dedupe_backend(backend: str | None) -> str | None:
    """``"cpu:gloo,cpu:gloo"`` -> ``"cpu:gloo"``: keep the first backend per device type, as torch requires."""
    if not backend or ":" not in backend:
        return backend
    kept: dict[str, str] = {}
    for part in backend.split(","):
        part = part.strip()
        if not part:
            continue
        device, _, name = part.partition(":")
        kept.setdefault(device, name)
    return ",".join(f"{device}:{name}" for device, name in kept.items())


def _patch_init_process_group() -> None:
    import torch.distributed as dist

    original = dist.init_process_group
    if getattr(original, "_verl_ext_dedupe", False):
        return

    @functools.wraps(original)
    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        if "backend" in kwargs:
            kwargs["backend"] = dedupe_backend(kwargs["backend"])
        elif args:
            args = (dedupe_backend(args[0]), *args[1:])
        return original(*args, **kwargs)

    init_process_group._verl_ext_dedupe = True  # type: ignore[attr-defined]
    dist.init_process_group = init_process_group


def _patch_engine_lookup(engine_base: types.ModuleType) -> None:
    """Make verl's FSDP engines (registered for cuda/npu) resolvable for device ``cpu``.

    Installed when verl imports ``verl.workers.engine.base`` and applied at the first lookup: importing the engines
    from the plugin costs about a second in every process ``import verl`` runs in. Only verl's FSDP classes are added.
    """
    registry_cls = engine_base.EngineRegistry

    original = registry_cls.get_engine_cls.__func__
    if getattr(original, "_verl_ext_cpu", False):
        return

    def get_engine_cls(cls: type, model_type: str, backend: str) -> type:
        registry = cls._engines.get(model_type, {}).get(backend, {})
        if "cpu" not in registry and not os.getenv("VERL_ENGINE_DEVICE"):
            for key, engine_cls in list(registry.items()):
                device = key[0] if isinstance(key, tuple) else key
                if device == "cuda" and engine_cls.__module__.startswith("verl.workers.engine.fsdp."):
                    registry["cpu"] = engine_cls
                    logger.info(
                        "verl_ext: registered %s for device cpu (%s/%s)", engine_cls.__name__, model_type, backend
                    )
                    break
        return original(cls, model_type, backend)

    get_engine_cls._verl_ext_cpu = True  # type: ignore[attr-defined]
    registry_cls.get_engine_cls = classmethod(get_engine_cls)


def activate() -> None:
    """Register the ``cpu`` platform and the CPU workarounds; idempotent. Called when ``VERL_PLATFORM=cpu``."""
    from verl_ext.plugin.post_import import when_imported

    PlatformRegistry.register(platform=PLATFORM_NAME)(CPUPlatform)
    _patch_init_process_group()
    when_imported("verl.workers.engine.base", _patch_engine_lookup)


def requested() -> bool:
    """True when this process was asked to run verl on CPU."""
    return os.environ.get("VERL_PLATFORM", "").strip().lower() == PLATFORM_NAME
