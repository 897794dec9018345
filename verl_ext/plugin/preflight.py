"""Check verl_ext's side of a run in the driver, before Ray starts: a misspelled option fails in seconds, last.

verl's entry points (``main_ppo``, ``main_ppo_v0``, one-step-off-policy) call ``verl.utils.config.validate_config``
on the composed config before ``ray.init``; the plugin wraps it. Otherwise the first rollout would find a bad option
minutes later, in an agent-loop worker, with the message buried in the log. Here, before verl's own checks:

- every verl_ext option (the top-level ``verl_ext:`` section merged with each verl_ext loop's entry in
  ``rollout.agent.agent_loop_config_path``) is validated; an error is printed as the last line and the process
  exits with status 2, without a traceback (it is the user's input, not a crash);
- what turns verl_ext off or breaks it on every node, one line each: a ``default_agent_loop`` no loop is registered
  under (``verl_ext_tool_agnet``), ``multi_turn.enable=false`` or ``calculate_log_probs=false`` with a verl_ext loop
  (the presets set both; a later override can undo them), a ``verl_ext.records.dir`` the driver cannot create;
- where the default loop is ``verl_ext_gateway_agent`` (the ``gateway`` preset), its harness (``verl_ext.harness``
  with the loop entry's ``harness`` key over it): named, importable and callable with the loop's keywords, or a
  command whose program exists; ``branches: all`` only where verl's trainer can train every branch (the v1 trainer,
  GRPO, no distillation), else refused with the reason (verl_ext.plugin.harness_options.branches_all_refusal);
- the local parquet files of ``data.train_files`` / ``data.val_files`` are read for an ``agent_name`` column: with
  ``verl_ext.agent_name_column=stop`` a row naming a loop that is not verl_ext's stops the run here; otherwise one
  line says which rows switch to verl_ext's loop and which will bypass it.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from verl_ext.plugin.config_errors import PreflightError

if TYPE_CHECKING:
    from verl_ext.plugin.harness_options import HarnessOptions
    from verl_ext.plugin.loop_routing import LoopRouter
    from verl_ext.plugin.options import LoopOptions

# verl imports verl.utils.config in every process: this module stays light; the checks import what they need


__all__ = ["PreflightError", "check_config", "wrap_validate_config"]  # PreflightError: verl_ext.plugin.config_errors


def check_config(config: Any) -> list[str]:
    """Validate verl_ext's side of the config and the datasets' ``agent_name`` column; return the lines to print.
    Raises OptionsError, UnknownLoopError or PreflightError with a message that names the problem and the fix."""
    from verl_ext.plugin.loop_routing import (
        DEFAULT_LOOP_KEY,
        LoopKind,
        LoopRouter,
        default_loop_kind,
        loop_kind,
        registered_loops,
    )
    from verl_ext.plugin.options import LoopOptions

    agent = config.actor_rollout_ref.rollout.agent
    registry = registered_loops(agent)
    section = config.get("verl_ext")
    default_loop = str(agent.default_agent_loop)
    kind = loop_kind(default_loop, registry)
    if section is None and not kind.verl_ext and not default_loop.startswith("verl_ext"):
        return []  # verl_ext is installed, not used: nothing to say
    if kind is LoopKind.UNREGISTERED:
        default_loop_kind(agent)  # raises UnknownLoopError, naming the closest registered loops
    ours = {name for name in registry if loop_kind(name, registry).verl_ext}
    options = LoopOptions.from_sources(section)  # the top-level section alone, then as each loop merges it
    merged = {name: _loop_options(config, section, name, registry[name]) for name in sorted(ours)}
    router = LoopRouter.from_config(config, registry)
    if router is None:
        return [
            f"verl_ext: options are set but {DEFAULT_LOOP_KEY}={default_loop}: verl_ext runs only on rows whose "
            "agent_name column names its loop. Set default_agent_loop=verl_ext_tool_agent (or select a preset: "
            "+verl_ext=warn) to switch it on."
        ]
    loop_options = merged.get(default_loop, options)
    _check_rollout_settings(config, default_loop, loop_options)
    harness = _gateway_harness(config, default_loop, registry[default_loop], loop_options)
    for records_dir in sorted({o.records.dir for o in (options, *merged.values()) if o.records.dir}):
        _check_records_dir(records_dir)
    lines = [
        f"verl_ext: options checked before Ray starts: loop {default_loop}, check {loop_options.check.mode.value}, "
        f"records {loop_options.records.dir or 'off'}, agent_name column: {router.column.value}"
    ]
    if harness is not None:
        lines.append(f"verl_ext: {default_loop} runs the {harness.describe()}")
    elif options.harness.function is not None or options.harness.command is not None:
        lines.append(
            f"verl_ext: WARNING: verl_ext.harness is set but {DEFAULT_LOOP_KEY}={default_loop}: a harness runs only "
            "under verl_ext_gateway_agent (+verl_ext=gateway), so it is not used"
        )
    for key in ("train_files", "val_files"):
        lines += _dataset_lines(f"data.{key}", config.data.get(key), router)
    return lines


def _loop_options(config: Any, section: Any, name: str, entry: Mapping[str, Any]) -> LoopOptions:
    """The options loop ``name`` runs with (the top-level section, then its own entry's ``verl_ext`` key); an error
    in its entry says where."""
    from verl_ext.plugin.options import LoopOptions, OptionsError

    own = entry.get("verl_ext") if hasattr(entry, "get") else None
    try:
        return LoopOptions.from_sources(section, own)
    except OptionsError as exc:
        if own is None:
            raise
        path = config.actor_rollout_ref.rollout.agent.get("agent_loop_config_path")
        raise OptionsError(f"{path}: the verl_ext key of agent loop {name!r}: {exc}") from None


def _gateway_harness(config: Any, name: str, entry: Any, options: LoopOptions) -> HarnessOptions | None:
    """The harness loop ``name`` runs (``verl_ext.harness``, its entry's ``harness`` key over it), checked that it can
    run, where the loop is ``verl_ext_gateway_agent`` or a subclass; None for any other loop."""
    from verl_ext.plugin.harness_options import HarnessOptions, branches_all_refusal, check_harness
    from verl_ext.plugin.options import OptionsError

    target = entry.get("_target_") if hasattr(entry, "get") else None
    if not _runs_a_harness(None if target is None else str(target)):
        return None
    try:
        harness = HarnessOptions.from_mapping(entry.get("harness"), base=options.harness, where="harness")
    except OptionsError as exc:
        path = config.actor_rollout_ref.rollout.agent.get("agent_loop_config_path")
        raise OptionsError(f"{path}: the harness key of agent loop {name!r}: {exc}") from None
    check_harness(harness.required())
    refusal = branches_all_refusal(config) if harness.branches == "all" else None
    if refusal is not None:
        raise OptionsError(refusal)
    return harness


def _runs_a_harness(target: str | None) -> bool:
    """A registry entry's ``_target_`` is ``VerlExtGatewayAgentLoop`` or a subclass (a target that does not import is
    not: verl reports it)."""
    import importlib

    from verl_ext.plugin.loop_names import GATEWAY_LOOP_PATH as _GATEWAY_LOOP_PATH

    if not target:
        return False
    if target == _GATEWAY_LOOP_PATH:
        return True
    module_name, _, attr = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError, ValueError):
        return False
    from verl_ext.plugin.gateway_loop import VerlExtGatewayAgentLoop

    return isinstance(cls, type) and issubclass(cls, VerlExtGatewayAgentLoop)


def _check_rollout_settings(config: Any, loop: str, options: LoopOptions) -> None:
    """The rollout settings a verl_ext loop needs, which a later override can undo after a preset set them."""
    from verl_ext.check.policy import CheckMode

    rollout = config.actor_rollout_ref.rollout
    if not rollout.multi_turn.get("enable"):
        raise PreflightError(
            f"actor_rollout_ref.rollout.multi_turn.enable=false with default_agent_loop={loop}: {loop} is a "
            "multi-turn tool-calling loop, and with the flag off verl marks the batch single-turn (its fully-async "
            "trainer runs every row with single_turn_agent, bypassing verl_ext). Fix: "
            "actor_rollout_ref.rollout.multi_turn.enable=true (every verl_ext preset sets it; an override after the "
            "preset turned it off), with a multi_turn.format and tools."
        )
    if options.check.mode is not CheckMode.OFF and not rollout.get("calculate_log_probs"):
        raise PreflightError(
            f"actor_rollout_ref.rollout.calculate_log_probs=false with default_agent_loop={loop}: the check compares "
            "the engine's logprobs with the trainer's, and without them it fails every rollout. Fix: "
            "actor_rollout_ref.rollout.calculate_log_probs=true (every verl_ext preset sets it), or "
            "verl_ext.check.mode=off to run without the check."
        )


def _check_records_dir(path: str) -> None:
    """Create ``verl_ext.records.dir`` here, in the driver, and write a file in it; a folder that cannot be is a
    PreflightError (on the workers a write that fails is only counted: records never stop training)."""
    from verl_ext.telemetry.records import records_folder_problem

    problem = records_folder_problem(path)
    if problem:
        raise PreflightError(
            f"verl_ext.records.dir={path}: cannot be created or written in the driver ({problem}). Fix: a folder "
            "every node can create and write (shared storage on a multi-node cluster), or verl_ext.records.dir=null "
            "for no records."
        )


def _dataset_lines(key: str, files: Any, router: LoopRouter) -> list[str]:
    from verl_ext.plugin.loop_routing import bypass_message
    from verl_ext.plugin.options import AgentNameColumn

    lines = []
    for path in [files] if isinstance(files, str) else list(files or []):
        names = _agent_names(str(path))
        if names is None:
            continue
        switched: Counter[str] = Counter()
        bypassing: Counter[str] = Counter()
        for name, n in names.items():
            if router.is_verl_ext(name) or name == router.default_loop:
                continue
            if router.column is AgentNameColumn.STOP:
                raise PreflightError(bypass_message(name, router.default_loop, where=f"{key} {path} ({n} rows)"))
            route = router.route(name)
            (switched if route.switched else bypassing)[name] += n
        if switched:
            lines.append(
                f"verl_ext: {key} {path}: {_counts(switched)} in the agent_name column run {router.default_loop} "
                "(verl_ext.agent_name_column=switch)"
            )
        if bypassing:
            lines.append(
                f"verl_ext: WARNING: {key} {path}: {_counts(bypassing)} in the agent_name column will bypass "
                f"verl_ext (counted as tito/loop/bypassed, warned each step). Fix: set their agent_name to "
                f"{router.default_loop} or drop the column; or verl_ext.agent_name_column=stop to refuse them."
            )
    return lines


def _counts(names: Counter[str]) -> str:
    return ", ".join(f"{n} rows naming {name}" for name, n in sorted(names.items()))


def _agent_names(path: str) -> Counter[str] | None:
    """The agent_name column of a local parquet file, counted; None when the file is not local parquet (verl
    copies remote files later; those rows are then routed, counted and warned about as they run)."""
    if not (os.path.isfile(path) and path.endswith(".parquet")):
        return None
    import pyarrow.parquet as pq

    if "agent_name" not in pq.read_schema(path).names:
        return Counter()
    column = pq.read_table(path, columns=["agent_name"]).column("agent_name").to_pylist()
    return Counter(str(name) for name in column if name is not None)


def wrap_validate_config(config_module: Any) -> None:
    """Run ``check_config`` first inside ``verl.utils.config.validate_config`` (called by verl's drivers)."""
    original: Callable[..., Any] = config_module.validate_config
    if getattr(original, "_verl_ext", False):
        return

    def validate_config(config: Any, *args: Any, **kwargs: Any) -> Any:
        from verl_ext.plugin.loop_routing import UnknownLoopError
        from verl_ext.plugin.options import OptionsError

        try:
            lines = check_config(config)
        except (OptionsError, PreflightError, UnknownLoopError) as exc:
            # the user's input, not a crash: no traceback, the message last, before Ray starts
            print(f"\nverl_ext: configuration error (checked before Ray starts):\n  {exc}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        for line in lines:
            print(line, file=sys.stderr, flush=True)
        return original(config, *args, **kwargs)

    validate_config._verl_ext = True  # type: ignore[attr-defined]
    validate_config.__wrapped__ = original  # type: ignore[attr-defined]
    config_module.validate_config = validate_config
