"""Which agent loop runs each rollout when a verl_ext loop is verl's default: nothing bypasses verl_ext unseen.

verl 0.9.1 picks the loop per dataset row: ``AgentLoopWorker.generate_sequences`` (v0) and
``AgentLoopWorkerTQ.generate_sequences`` (v1) fill the ``agent_name`` column with
``rollout.agent.default_agent_loop`` only when the dataset has no such column, and both then call
``AgentLoopWorker._run_agent_loop(..., agent_name=...)`` once per rollout. verl's own tool-agent preprocessing writes
``agent_name: tool_agent`` into every row, so with ``default_agent_loop=verl_ext_tool_agent`` the stock loop would run
and verl_ext would be silently off. The plugin wraps ``_run_agent_loop`` (the one place both trainers pass through):

- ``verl_ext.agent_name_column=switch`` (default): rows naming verl's stock ``tool_agent`` run the default verl_ext
  loop; rows naming any other loop run it;
- ``stop``: a row naming a loop that is not verl_ext's stops the run, with the column and the fix;
- ``keep``: every row runs the loop it names.

Every rollout is counted as ``tito/loop/<name>`` (plus ``tito/loop/switched`` and ``tito/loop/bypassed``), and the
tracker hook warns once per step when any rollout bypassed verl_ext (metrics_sink). Nothing changes when the default
loop is not a verl_ext loop.

What a loop name means is decided here once, for the routing, the driver's preflight and the SGLang server switch
alike (``LoopKind``, ``loop_kind``, ``default_loop_kind``): a registered loop whose ``_target_`` is (a subclass of)
``VerlExtToolAgentLoop`` is token-exact (verl_ext's SGLang server), of ``AuditedToolAgentLoop`` audited (verl's own
server), anything else registered another loop, and a name no loop is registered under an error.
"""

from __future__ import annotations

import difflib
import importlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from verl_ext.core.errors import VerlExtError
from verl_ext.plugin.options import AgentNameColumn, LoopOptions

log = logging.getLogger("verl_ext.plugin")

STOCK_TOOL_AGENT = "tool_agent"  # the loop verl_ext_tool_agent (and its audited twin) stands in for
DEFAULT_LOOP_KEY = "actor_rollout_ref.rollout.agent.default_agent_loop"
_CONFIG_PATH_KEY = "actor_rollout_ref.rollout.agent.agent_loop_config_path"


class LoopKind(StrEnum):
    """What a loop name means to verl_ext: the one rule behind loop routing, the preflight and the SGLang server
    switch (``loop_kind``)."""

    TOKEN_EXACT = "token_exact"  # verl_ext_tool_agent or a subclass: verl_ext's token-exact SGLang server
    AUDITED = "audited"  # verl_ext_audited_tool_agent or a subclass: verl's own server, as it is, check watching
    OTHER = "other"  # a registered loop that is not verl_ext's
    UNREGISTERED = "unregistered"  # no loop has this name: verl would fail on it inside a worker

    @property
    def verl_ext(self) -> bool:
        """A verl_ext loop runs (the check watches its rollouts)."""
        return self in (LoopKind.TOKEN_EXACT, LoopKind.AUDITED)


_KNOWN_TARGETS = {
    "verl_ext.plugin.agent_loop.VerlExtToolAgentLoop": LoopKind.TOKEN_EXACT,
    "verl_ext.plugin.audit_loop.AuditedToolAgentLoop": LoopKind.AUDITED,
}
VERL_EXT_LOOP_TARGETS = frozenset(_KNOWN_TARGETS)


class UnknownLoopError(VerlExtError, ValueError):
    """``default_agent_loop`` names no registered agent loop (a misspelling, a missing ``agent_loop_config_path``)."""


def target_kind(target: str | None) -> LoopKind:
    """The kind of a registry entry's ``_target_``: verl_ext's loop, its audited twin, a subclass of either (found by
    importing the target), or another loop. A target that does not import is another loop: verl reports it."""
    if not target:
        return LoopKind.OTHER
    if target in _KNOWN_TARGETS:
        return _KNOWN_TARGETS[target]
    module_name, _, attr = target.rpartition(".")
    if not module_name:
        return LoopKind.OTHER
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        # verl fails on this name with its own error when a row uses it; here it cannot be one of ours
        log.debug("verl_ext: agent loop target %s does not import (%s)", target, exc)
        return LoopKind.OTHER
    from verl_ext.plugin.agent_loop import VerlExtToolAgentLoop
    from verl_ext.plugin.audit_loop import AuditedToolAgentLoop

    if isinstance(cls, type) and issubclass(cls, VerlExtToolAgentLoop):
        return LoopKind.TOKEN_EXACT
    if isinstance(cls, type) and issubclass(cls, AuditedToolAgentLoop):
        return LoopKind.AUDITED
    return LoopKind.OTHER


def is_verl_ext_target(target: str | None) -> bool:
    """A registry entry's ``_target_`` is verl_ext's loop, its audited twin, or a subclass of either."""
    return target_kind(target).verl_ext


def loop_kind(name: str, registry: Mapping[str, Any]) -> LoopKind:
    """The kind of the loop registered as ``name`` in ``registry`` (``registered_loops``)."""
    entry = registry.get(name)
    if entry is None:
        return LoopKind.UNREGISTERED
    target = entry.get("_target_") if hasattr(entry, "get") else None
    return target_kind(None if target is None else str(target))


def registered_loops(agent_config: Any) -> dict[str, Mapping[str, Any]]:
    """Every agent-loop name verl's workers will know, with its registry entry: verl's own loops (and any a
    ``VERL_USE_EXTERNAL_MODULES`` module registers), verl_ext's, and the entries of ``agent_loop_config_path``
    (``agent_config`` is ``actor_rollout_ref.rollout.agent``, a mapping or verl's dataclass). Raises
    ``PreflightError`` naming the file for an ``agent_loop_config_path`` verl could not load."""
    from verl.experimental.agent_loop.agent_loop import _agent_loop_registry

    from verl_ext.plugin.loop_names import AGENT_LOOP_NAME, AGENT_LOOP_PATH, AUDIT_LOOP_NAME, AUDIT_LOOP_PATH

    registry: dict[str, Mapping[str, Any]] = {str(k): v for k, v in _agent_loop_registry.items()}
    registry[AGENT_LOOP_NAME] = {"_target_": AGENT_LOOP_PATH}
    registry[AUDIT_LOOP_NAME] = {"_target_": AUDIT_LOOP_PATH}
    path = _get(agent_config, "agent_loop_config_path")
    if path:
        for entry in agent_loop_entries(str(path)):
            registry[str(entry["name"])] = entry
    return registry


def agent_loop_entries(path: str) -> list[Mapping[str, Any]]:
    """The entries of ``rollout.agent.agent_loop_config_path``: a YAML list of mappings, each with a ``name``.
    Anything else is a PreflightError naming the file and the fix (verl would fail on it later, in a worker)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf
    from verl.utils.import_utils import resolve_config_path

    from verl_ext.plugin.config_errors import PreflightError

    shape = "a YAML list of agent loops, each a mapping with 'name' and '_target_'"
    try:
        loaded = OmegaConf.load(resolve_config_path(path))
    except (OSError, UnicodeDecodeError) as exc:  # missing, a folder, not UTF-8, not a YAML container
        raise PreflightError(
            f"{_CONFIG_PATH_KEY}={path}: cannot be read ({type(exc).__name__}: {exc}); pass {shape}"
        ) from None
    except Exception as exc:  # the YAML parser's errors (yaml.YAMLError) span lines: the problem and its line
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split()) or type(exc).__name__
        raise PreflightError(f"{_CONFIG_PATH_KEY}={path}: not valid YAML{where} ({problem}); pass {shape}") from None
    if isinstance(loaded, DictConfig) and not loaded:
        return []  # an empty file registers nothing
    if not isinstance(loaded, ListConfig):
        raise PreflightError(f"{_CONFIG_PATH_KEY}={path}: expected {shape}, found a mapping")
    entries = []
    for k, entry in enumerate(loaded):
        if not isinstance(entry, DictConfig) or not isinstance(entry.get("name"), str):
            raise PreflightError(
                f"{_CONFIG_PATH_KEY}={path}: entry {k} must be a mapping with a string 'name', got {entry!r}"
            )
        entries.append(entry)
    return entries


def default_loop_kind(agent_config: Any) -> tuple[str, LoopKind]:
    """``default_agent_loop`` and its kind, for the preflight and the SGLang server switch alike. Raises
    ``UnknownLoopError`` (naming the closest registered names) when no loop has that name."""
    name = str(_get(agent_config, "default_agent_loop") or "")
    registry = registered_loops(agent_config)
    kind = loop_kind(name, registry)
    if kind is LoopKind.UNREGISTERED:
        close = difflib.get_close_matches(name, list(registry), n=2, cutoff=0.6)
        hint = f"did you mean {' or '.join(close)}? " if close else ""
        raise UnknownLoopError(
            f"{DEFAULT_LOOP_KEY}={name} is not a registered agent loop ({hint}registered: "
            f"{', '.join(sorted(registry))}); verl would fail on it inside a worker, after Ray started. Fix: name "
            f"one of those, or register yours in {_CONFIG_PATH_KEY}."
        )
    return name, kind


def server_enabled(rollout_config: Any, environ: Mapping[str, str] | None = None) -> bool:
    """verl_ext's SGLang server is on when ``rollout.agent.default_agent_loop`` is verl_ext's token-exact loop or a
    subclass of it, by the rule loop routing uses (``LoopKind``); the audited loop keeps verl's own server as it is
    (that is what it audits). ``VERL_EXT_SGLANG_SERVER`` = 1/0 in ``environ`` (the process environment by default)
    forces it on or off. Raises ``UnknownLoopError`` for a name no loop is registered under (a misspelling gets an
    error, not a server)."""
    from verl_ext.engines.sglang_output import forced_switch

    forced = forced_switch(environ)
    if forced is not None:
        return forced
    return default_loop_kind(_get(rollout_config, "agent"))[1] is LoopKind.TOKEN_EXACT


def _get(obj: Any, key: str) -> Any:
    """``obj[key]`` for a mapping, an OmegaConf config or verl's config dataclasses (which have ``get``)."""
    if obj is None:
        return None
    return obj.get(key) if hasattr(obj, "get") else getattr(obj, key, None)


class BypassError(VerlExtError, ValueError):
    """A dataset row names a loop that is not verl_ext's while ``verl_ext.agent_name_column=stop``."""


def bypass_message(agent_name: str, default_loop: str, where: str = "a dataset row") -> str:
    """The one-line error for a row that names another loop than verl_ext's, with the fixes."""
    return (
        f"verl_ext: {where} has agent_name={agent_name!r}: the dataset's `agent_name` column overrides "
        f"{DEFAULT_LOOP_KEY}={default_loop}, so verl would run its {agent_name} loop and bypass verl_ext's token "
        f"guarantee and check. Fix: drop the `agent_name` column from the dataset (or set it to {default_loop!r})"
        + (
            ", or set verl_ext.agent_name_column=switch to run those rows with verl_ext's loop."
            if agent_name == STOCK_TOOL_AGENT
            else f"; or set verl_ext.agent_name_column=keep to let {agent_name} run unchecked (counted and warned)."
        )
    )


@dataclass(frozen=True)
class Route:
    """The loop one rollout runs, and why."""

    loop: str
    switched: bool  # the row named another loop; verl_ext's runs instead
    verl_ext: bool  # the loop that runs is a verl_ext loop (the check watches it)

    def counters(self) -> dict[str, int]:
        """The ``tito/loop/...`` counts this rollout adds."""
        counts = {f"loop/{self.loop}": 1}
        if self.switched:
            counts["loop/switched"] = 1
        if not self.verl_ext:
            counts["loop/bypassed"] = 1
        return counts


class LoopRouter:
    """Routes rows for one worker: built from verl's config and agent-loop registry."""

    def __init__(self, default_loop: str, column: AgentNameColumn, registry: Mapping[str, Any]) -> None:
        self.default_loop = default_loop
        self.column = column
        self._registry = registry
        self._is_ours: dict[str, bool] = {}

    @classmethod
    def from_config(cls, config: Any, registry: Mapping[str, Any]) -> LoopRouter | None:
        """None when the default loop is not a verl_ext loop: then verl_ext routes nothing and counts nothing."""
        default_loop = str(config.actor_rollout_ref.rollout.agent.default_agent_loop)
        router = cls(default_loop, AgentNameColumn.SWITCH, registry)
        if not router.is_verl_ext(default_loop):
            return None
        options = LoopOptions.from_sources(config.get("verl_ext"), _loop_options(registry.get(default_loop)))
        router.column = options.agent_name_column
        return router

    def is_verl_ext(self, name: str) -> bool:
        """Whether the registered loop ``name`` is one of verl_ext's (False for an unregistered name)."""
        if name not in self._is_ours:
            self._is_ours[name] = loop_kind(name, self._registry).verl_ext
        return self._is_ours[name]

    def route(self, agent_name: str) -> Route:
        """The loop a row naming ``agent_name`` runs. Raises ``BypassError`` when it is not verl_ext's and
        ``agent_name_column`` is stop."""
        if agent_name == self.default_loop or self.is_verl_ext(agent_name):
            return Route(agent_name, switched=False, verl_ext=True)
        if self.column is AgentNameColumn.STOP:
            raise BypassError(bypass_message(agent_name, self.default_loop))
        if self.column is AgentNameColumn.SWITCH and agent_name == STOCK_TOOL_AGENT:
            return Route(self.default_loop, switched=True, verl_ext=True)
        return Route(agent_name, switched=False, verl_ext=False)


def _loop_options(entry: Any) -> Any:
    return entry.get("verl_ext") if entry is not None and hasattr(entry, "get") else None


_UNSET = object()


def install_routing(agent_loop_module: Any) -> None:
    """Wrap ``AgentLoopWorker._run_agent_loop`` (v0, and v1's AgentLoopWorkerTQ, which inherits it)."""
    worker_cls = agent_loop_module.AgentLoopWorker
    original = worker_cls._run_agent_loop
    if getattr(original, "_verl_ext", False):
        return
    registry = agent_loop_module._agent_loop_registry

    async def _run_agent_loop(
        self: Any, sampling_params: dict[str, Any], trajectory: dict[str, Any], *, agent_name: str, **kwargs: Any
    ) -> Any:
        router = self.__dict__.get("_verl_ext_router", _UNSET)
        if router is _UNSET:
            # the worker loaded agent_loop_config_path into the registry in its __init__: it is complete now
            router = self.__dict__["_verl_ext_router"] = LoopRouter.from_config(self.config, registry)
        if router is None:
            return await original(self, sampling_params, trajectory, agent_name=agent_name, **kwargs)
        route = router.route(str(agent_name))
        output = await original(self, sampling_params, trajectory, agent_name=route.loop, **kwargs)
        from verl_ext.plugin import metrics_sink

        metrics_sink.count(route.counters())
        return output

    _run_agent_loop._verl_ext = True  # type: ignore[attr-defined]
    _run_agent_loop.__wrapped__ = original  # type: ignore[attr-defined]
    worker_cls._run_agent_loop = _run_agent_loop
