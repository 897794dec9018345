"""verl_ext's ``verl.plugins`` entry point: verl 0.9.1 imports this module in every process that runs ``import verl``.

It registers, cheaply (names and import paths only; the heavy modules load when verl first uses them):

* the agent loop ``rollout.agent.default_agent_loop=verl_ext_tool_agent`` (verl_ext.plugin.agent_loop),
  its audit-only twin ``verl_ext_audited_tool_agent`` (verl's stock ``tool_agent`` with the check watching), the
  gateway loop ``verl_ext_gateway_agent`` (a harness per row through the OpenAI-compatible gateway), and a
  hook that adds the ``tito/`` metrics to each step's metrics in verl's tracker;
* the numerics view's hooks: the v0 and v1 trainers' old-logprob passes, and in bypass mode the policy losses of
  verl's registry (verl_ext.plugin.numerics_trainer, verl_ext.plugin.numerics_loss);
* the CPU rollout backend ``actor_rollout_ref.rollout.name=verl_ext_cpu`` (verl_ext.engines.cpu);
* verl_ext's SGLang server for ``actor_rollout_ref.rollout.name=sglang`` (verl_ext.engines.sglang_server), used when
  the rollout runs ``verl_ext_tool_agent`` or a subclass (the rule of verl_ext.plugin.loop_routing.LoopKind); SGLang
  itself is imported only when verl builds an SGLang replica;
* the ``cpu`` platform and its workarounds, only when ``VERL_PLATFORM=cpu`` (verl_ext.plugin.cpu_platform).

verl logs a failing plugin import at DEBUG only, so a failure here is logged at ERROR with its cause and the module
still imports. Where entry points are disabled (``VERL_USE_EXTERNAL_PLUGINS=none``), load it with
``VERL_USE_EXTERNAL_MODULES=verl_ext.plugin``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from verl_ext.plugin.loop_names import (
    AGENT_LOOP_NAME,
    AUDIT_LOOP_NAME,
    CPU_ROLLOUT_NAME,
    GATEWAY_LOOP_NAME,
)
from verl_ext.plugin.loop_names import AGENT_LOOP_PATH as _AGENT_LOOP_PATH
from verl_ext.plugin.loop_names import AUDIT_LOOP_PATH as _AUDIT_LOOP_PATH
from verl_ext.plugin.loop_names import CPU_ADAPTER_PATH as _CPU_ADAPTER_PATH
from verl_ext.plugin.loop_names import GATEWAY_LOOP_PATH as _GATEWAY_LOOP_PATH

logger = logging.getLogger("verl_ext.plugin")
# verl sets the root logger to WARNING; the plugin's and the CPU engine's INFO lines (loaded, weight syncs) are the
# evidence a run is wired as intended, so they are let through unless VERL_EXT_LOG_LEVEL says otherwise.
for _name in ("verl_ext.plugin", "verl_ext.engines"):
    logging.getLogger(_name).setLevel(os.getenv("VERL_EXT_LOG_LEVEL", "INFO").upper())


def _load_cpu_replica() -> type:
    from verl_ext.engines.cpu import CPURolloutReplica

    return CPURolloutReplica


def register_cpu_rollout() -> None:
    """Register the CPU backend in both of verl's rollout registries (driver-side replica, worker-side adapter)."""
    from verl.workers.rollout import base as rollout_base
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    RolloutReplicaRegistry.register(CPU_ROLLOUT_NAME, _load_cpu_replica)
    # Private dict with no register function in verl 0.9.1; the adapter class is imported by verl when used.
    rollout_base._ROLLOUT_REGISTRY[(CPU_ROLLOUT_NAME, "async")] = _CPU_ADAPTER_PATH


def register_sglang_rollout() -> None:
    """Wrap verl's ``sglang`` replica loader: verl's loader runs first (its import-time workarounds), then the
    replica that launches verl_ext's server when verl_ext is switched on (verl_ext.engines.sglang_output)."""
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    original = RolloutReplicaRegistry._registry.get("sglang")
    if original is None or getattr(original, "_verl_ext", False):
        return

    def load_sglang_replica() -> type:
        original()
        from verl_ext.engines.sglang_server import TokenExactSGLangReplica
        from verl_ext.plugin.loop_routing import server_enabled

        TokenExactSGLangReplica.server_switch = staticmethod(server_enabled)  # which loop runs: the plugin's rule
        return TokenExactSGLangReplica

    load_sglang_replica._verl_ext = True  # type: ignore[attr-defined]
    RolloutReplicaRegistry.register("sglang", load_sglang_replica)


def _explain_override_errors(module: Any) -> None:
    """Runs inside ``import hydra``: a failure is logged, never breaks the import (Hydra's own message stands)."""
    try:
        from verl_ext.plugin.overrides import explain_hydra_errors

        explain_hydra_errors(module)
    except Exception:
        logging.getLogger("verl_ext.plugin").exception(
            "verl_ext: could not explain Hydra's override errors; an unquoted special token keeps Hydra's lexer error"
        )


def register_agent_loops() -> None:
    """Register ``verl_ext_tool_agent`` in verl's agent-loop registry, and the tito/ metrics hook on verl's tracker,
    when verl imports those modules (importing them from here, inside ``import verl``, would be circular)."""
    from verl_ext.plugin.hydra_group import register_searchpath_plugin
    from verl_ext.plugin.post_import import when_imported

    def add_loop(module: Any) -> None:
        module._agent_loop_registry[AGENT_LOOP_NAME] = {"_target_": _AGENT_LOOP_PATH}
        module._agent_loop_registry[AUDIT_LOOP_NAME] = {"_target_": _AUDIT_LOOP_PATH}
        module._agent_loop_registry[GATEWAY_LOOP_NAME] = {"_target_": _GATEWAY_LOOP_PATH}
        from verl_ext.plugin.loop_routing import install_routing

        install_routing(module)  # rows whose agent_name column names another loop cannot bypass verl_ext unseen

    def hook_tracking(module: Any) -> None:
        from verl_ext.plugin.metrics_sink import install_tracking_hook

        install_tracking_hook(module)

    def hook_validate_config(module: Any) -> None:
        from verl_ext.plugin.preflight import wrap_validate_config

        wrap_validate_config(module)  # verl's drivers call it before ray.init: verl_ext's options are checked there

    def hook_numerics(installer: str) -> Any:
        def hook(module: Any) -> None:
            import importlib

            owner, name = installer.rsplit(".", 1)
            getattr(importlib.import_module(owner), name)(module)

        return hook

    # the trainer's logprobs beside the engine's: the trainers' old-logprob passes in the driver; in bypass mode the
    # policy loss on the FSDP ranks (each hook's module says why it sits there)
    for module_name, installer in (
        ("verl.trainer.ppo.ray_trainer", "verl_ext.plugin.numerics_trainer.install_v0"),
        ("verl.trainer.ppo.v1.trainer_base", "verl_ext.plugin.numerics_trainer.install_v1"),
        ("verl.trainer.ppo.core_algos", "verl_ext.plugin.numerics_loss.install_registry"),
        ("verl.workers.utils.losses", "verl_ext.plugin.numerics_loss.install_micro_batch_channel"),
        ("verl.workers.engine.base", "verl_ext.plugin.numerics_loss.install_update_marker"),
    ):
        when_imported(module_name, hook_numerics(installer))
    when_imported("verl.experimental.agent_loop.agent_loop", add_loop)
    when_imported("verl.utils.tracking", hook_tracking)
    when_imported("verl.utils.config", hook_validate_config)
    when_imported("hydra", register_searchpath_plugin)  # once hydra is fully imported: Hydra's scan needs it
    when_imported("hydra", _explain_override_errors)  # an unquoted special token: Hydra's lexer error, explained


def _load() -> None:
    registered = []
    try:
        register_cpu_rollout()
        registered.append(f"rollout={CPU_ROLLOUT_NAME}")
        register_sglang_rollout()
        registered.append("rollout=sglang")
        register_agent_loops()
        registered.append(f"agent_loops={AGENT_LOOP_NAME},{AUDIT_LOOP_NAME},{GATEWAY_LOOP_NAME}")
        from verl_ext.plugin import cpu_platform

        if cpu_platform.requested():
            cpu_platform.activate()
            registered.append("platform=cpu")
    except Exception:
        logger.exception("verl_ext plugin failed to load (registered so far: %s)", registered or "nothing")
        return
    logger.info("verl_ext plugin loaded in pid %d: %s", os.getpid(), ", ".join(registered))


_load()
