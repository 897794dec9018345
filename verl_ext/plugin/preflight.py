"""Check verl_ext's side of a run in the driver, before Ray starts: a misspelled option fails in seconds, last.

verl's entry points (``main_ppo``, ``main_ppo_v0``, one-step-off-policy) call ``verl.utils.config.validate_config``
on the composed config before ``ray.init``; the plugin wraps it. Otherwise the first rollout would find a bad option
minutes later, in an agent-loop worker, with the message buried in the log. Here, before verl's own checks:

- every verl_ext option (the top-level ``verl_ext:`` section merged with each verl_ext loop's entry in
  ``rollout.agent.agent_loop_config_path``) is validated; an error is printed as the last line and the process
  exits with status 2, without a traceback (it is the user's input, not a crash);
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

from verl_ext.core.errors import VerlExtError
from verl_ext.plugin import (
    _AGENT_LOOP_PATH,
    _AUDIT_LOOP_PATH,
    _GATEWAY_LOOP_PATH,
    AGENT_LOOP_NAME,
    AUDIT_LOOP_NAME,
    GATEWAY_LOOP_NAME,
)

if TYPE_CHECKING:
    from verl_ext.plugin.loop_routing import LoopRouter

# verl imports verl.utils.config in every process: this module stays light; the checks import what they need

_BUILTIN = {  # the loops the plugin registers, under the names and paths it registers them with
    AGENT_LOOP_NAME: {"_target_": _AGENT_LOOP_PATH},
    AUDIT_LOOP_NAME: {"_target_": _AUDIT_LOOP_PATH},
    GATEWAY_LOOP_NAME: {"_target_": _GATEWAY_LOOP_PATH},
}


class PreflightError(VerlExtError, ValueError):
    """verl_ext's part of the config or the dataset would fail or bypass verl_ext: stop before Ray starts."""


def check_config(config: Any) -> list[str]:
    """Validate verl_ext's options and the datasets' ``agent_name`` column; return the lines to print.
    Raises OptionsError or PreflightError with a message that names the problem and the fix."""
    from verl_ext.plugin.loop_routing import DEFAULT_LOOP_KEY, LoopRouter
    from verl_ext.plugin.options import AgentNameColumn, LoopOptions, OptionsError

    registry = _registry_view(config)
    section = config.get("verl_ext")
    default_loop = str(config.actor_rollout_ref.rollout.agent.default_agent_loop)
    names = LoopRouter(default_loop, AgentNameColumn.SWITCH, registry)
    ours = {name for name in registry if names.is_verl_ext(name)}
    if section is None and default_loop not in ours:
        return []  # verl_ext is installed, not used: nothing to say
    options = LoopOptions.from_sources(section)  # the top-level section alone, then as each loop merges it
    for name in sorted(ours):
        options_of_loop = registry[name].get("verl_ext")
        if options_of_loop is not None:
            try:
                LoopOptions.from_sources(section, options_of_loop)
            except OptionsError as exc:  # say where: the loop's entry, not the top-level section
                path = config.actor_rollout_ref.rollout.agent.get("agent_loop_config_path")
                raise OptionsError(f"{path}: the verl_ext key of agent loop {name!r}: {exc}") from None
    router = LoopRouter.from_config(config, registry)
    lines = []
    if router is None:
        lines.append(
            f"verl_ext: options are set but {DEFAULT_LOOP_KEY}={default_loop}: verl_ext runs only on rows whose "
            "agent_name column names its loop. Set default_agent_loop=verl_ext_tool_agent (or select a preset: "
            "+verl_ext=warn) to switch it on."
        )
    else:
        lines.append(
            f"verl_ext: options checked before Ray starts: loop {default_loop}, check {options.check.mode.value}, "
            f"records {options.records.dir or 'off'}, agent_name column: {router.column.value}"
        )
        for key in ("train_files", "val_files"):
            lines += _dataset_lines(f"data.{key}", config.data.get(key), router)
    return lines


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


def _registry_view(config: Any) -> dict[str, Mapping[str, Any]]:
    """The agent-loop names verl's workers will know: verl_ext's, plus the entries of agent_loop_config_path."""
    registry: dict[str, Mapping[str, Any]] = dict(_BUILTIN)
    path = config.actor_rollout_ref.rollout.agent.get("agent_loop_config_path")
    if path:
        for entry in _agent_loop_entries(str(path)):
            registry[str(entry["name"])] = entry
    return registry


def _agent_loop_entries(path: str) -> list[Mapping[str, Any]]:
    """The entries of ``rollout.agent.agent_loop_config_path``: a YAML list of mappings, each with a ``name``.
    Anything else is a PreflightError naming the file and the fix (verl would fail on it later, in a worker)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf
    from verl.utils.import_utils import resolve_config_path

    key = "actor_rollout_ref.rollout.agent.agent_loop_config_path"
    shape = "a YAML list of agent loops, each a mapping with 'name' and '_target_'"
    try:
        loaded = OmegaConf.load(resolve_config_path(path))
    except (OSError, UnicodeDecodeError) as exc:  # missing, a folder, not UTF-8, not a YAML container
        raise PreflightError(f"{key}={path}: cannot be read ({type(exc).__name__}: {exc}); pass {shape}") from None
    except Exception as exc:  # the YAML parser's errors (yaml.YAMLError) span lines: the problem and its line
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split()) or type(exc).__name__
        raise PreflightError(f"{key}={path}: not valid YAML{where} ({problem}); pass {shape}") from None
    if isinstance(loaded, DictConfig) and not loaded:
        return []  # an empty file registers nothing
    if not isinstance(loaded, ListConfig):
        raise PreflightError(f"{key}={path}: expected {shape}, found a mapping")
    entries = []
    for k, entry in enumerate(loaded):
        if not isinstance(entry, DictConfig) or not isinstance(entry.get("name"), str):
            raise PreflightError(f"{key}={path}: entry {k} must be a mapping with a string 'name', got {entry!r}")
        entries.append(entry)
    return entries


def wrap_validate_config(config_module: Any) -> None:
    """Run ``check_config`` first inside ``verl.utils.config.validate_config`` (called by verl's drivers)."""
    original: Callable[..., Any] = config_module.validate_config
    if getattr(original, "_verl_ext", False):
        return

    def validate_config(config: Any, *args: Any, **kwargs: Any) -> Any:
        from verl_ext.plugin.options import OptionsError

        try:
            lines = check_config(config)
        except (OptionsError, PreflightError) as exc:
            # the user's input, not a crash: no traceback, the message last, before Ray starts
            print(f"\nverl_ext: configuration error (checked before Ray starts):\n  {exc}", file=sys.stderr, flush=True)
            raise SystemExit(2) from None
        for line in lines:
            print(line, file=sys.stderr, flush=True)
        return original(config, *args, **kwargs)

    validate_config._verl_ext = True  # type: ignore[attr-defined]
    validate_config.__wrapped__ = original  # type: ignore[attr-defined]
    config_module.validate_config = validate_config
