"""The verl.plugins entry point and the CPU platform glue (no Ray, no trainer)."""

from __future__ import annotations

import subprocess
import sys

from verl_ext.plugin.cpu_platform import CPUPlatform, dedupe_backend


def fresh_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a new interpreter (plugin loading and the platform are per process)."""
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", **env}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out


def test_entry_point_registers_the_cpu_backend_in_both_registries() -> None:
    import verl  # noqa: F401  (importing verl loads the entry point)
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import get_rollout_replica_class

    from verl_ext.engines.cpu import CPURolloutReplica, CPUServerAdapter

    assert get_rollout_replica_class("verl_ext_cpu") is CPURolloutReplica
    assert rollout_base.get_rollout_class("verl_ext_cpu", "async") is CPUServerAdapter


def test_backend_string_dedupe() -> None:
    assert dedupe_backend("cpu:gloo,cpu:gloo") == "cpu:gloo"
    assert dedupe_backend("cpu:gloo,cuda:nccl") == "cpu:gloo,cuda:nccl"
    assert dedupe_backend("gloo") == "gloo"
    assert dedupe_backend(None) is None


def test_platform_is_never_auto_detected() -> None:
    platform = CPUPlatform()
    assert platform.device_name == "cpu" and platform.current_device() == "cpu"
    assert platform.communication_backend_name() == "gloo" and platform.ray_resource_name() == "GPU"
    assert not platform.is_platform_available(use_smi_check=True)


def test_verl_platform_cpu_selects_the_platform_and_fsdp_engines() -> None:
    # a fresh interpreter: the platform is a per-process singleton and the env var is read at plugin import
    code = (
        "import verl\n"
        "from verl.utils.device import get_device_name, get_nccl_backend, get_device_id\n"
        "from verl.workers.engine import EngineRegistry\n"
        "print(get_device_name(), get_nccl_backend(), get_device_id(),\n"
        "      EngineRegistry.get_engine_cls('language_model', 'fsdp2').__name__)\n"
    )
    out = fresh_python(code, VERL_PLATFORM="cpu")
    assert out.stdout.split() == ["cpu", "gloo", "cpu", "FSDPEngineWithLMHead"]
    assert "verl_ext plugin loaded" in out.stderr and "platform=cpu" in out.stderr


def test_entry_point_registers_both_agent_loops_and_the_metrics_hook() -> None:
    import verl.experimental.agent_loop.agent_loop as agent_loop
    import verl.utils.tracking as tracking

    registry = agent_loop._agent_loop_registry
    assert registry["verl_ext_tool_agent"]["_target_"] == "verl_ext.plugin.agent_loop.VerlExtToolAgentLoop"
    assert registry["verl_ext_audited_tool_agent"]["_target_"] == "verl_ext.plugin.audit_loop.AuditedToolAgentLoop"
    assert registry["verl_ext_gateway_agent"]["_target_"] == "verl_ext.plugin.gateway_loop.VerlExtGatewayAgentLoop"
    assert getattr(tracking.Tracking.log, "_verl_ext", False)
    # the per-row loop routing (v1's AgentLoopWorkerTQ inherits it) and the driver-side preflight
    assert getattr(agent_loop.AgentLoopWorker._run_agent_loop, "_verl_ext", False)
    import verl.utils.config as verl_config_module

    assert getattr(verl_config_module.validate_config, "_verl_ext", False)


def test_a_failing_plugin_load_is_logged_at_error_not_swallowed() -> None:
    # verl swallows plugin import errors at DEBUG; ours must say what failed. Break one registration on purpose.
    code = (
        "import logging, verl.workers.rollout.replica as r\n"
        "logging.basicConfig(level=logging.INFO)\n"
        "def boom(*a, **k): raise RuntimeError('registry is gone')\n"
        "r.RolloutReplicaRegistry.register = boom\n"
        "import verl_ext.plugin\n"
    )
    out = fresh_python(code, VERL_USE_EXTERNAL_PLUGINS="none")  # the process goes on ...
    assert "ERROR" in out.stderr and "verl_ext plugin failed to load" in out.stderr  # ... and the failure is loud
    assert "registry is gone" in out.stderr


def test_external_modules_fallback_loads_the_plugin() -> None:
    code = "import verl.experimental.agent_loop.agent_loop as a; print('verl_ext_tool_agent' in a._agent_loop_registry)"
    out = fresh_python(code, VERL_USE_EXTERNAL_PLUGINS="none", VERL_USE_EXTERNAL_MODULES="verl_ext.plugin")
    assert out.stdout.strip() == "True" and "verl_ext plugin loaded" in out.stderr
