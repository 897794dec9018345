"""verl_ext's options for the agent loop, validated: an unknown key or a bad value names the key and the fix.

Options come from two places, merged in this order (later wins):
1. a top-level ``verl_ext:`` section of verl's config (``+verl_ext.check.mode=strict`` on the command line);
2. the ``verl_ext:`` key of the loop's entry in ``actor_rollout_ref.rollout.agent.agent_loop_config_path``.
See verl_ext/configs/verl_ext/warn.yaml for every key with its default (and gateway.yaml for ``verl_ext.harness``,
the harness of ``verl_ext_gateway_agent``: ``HarnessOptions``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from verl_ext.check.policy import CheckPolicy
from verl_ext.core.errors import OptionsError
from verl_ext.core.numerics import NumericsOptions
from verl_ext.core.option_rules import choice, reject_unknown
from verl_ext.plugin.harness_options import HarnessOptions

__all__ = ["AgentNameColumn", "HarnessOptions", "LoopOptions", "OptionsError", "RecordsOptions"]


class AgentNameColumn(StrEnum):
    """What to do with dataset rows whose ``agent_name`` column names another loop than verl_ext's default one
    (verl's own tool-agent preprocessing writes ``agent_name: tool_agent`` into every row, and that column
    overrides ``rollout.agent.default_agent_loop`` row by row)."""

    SWITCH = "switch"  # rows naming verl's stock tool_agent run the default verl_ext loop; other names run as named
    STOP = "stop"  # any row naming a loop that is not verl_ext's stops the run, naming the column and the fix
    KEEP = "keep"  # every row runs the loop it names (counted, and warned about once per step)


@dataclass(frozen=True)
class RecordsOptions:
    """``verl_ext.records``: each field is an option key with its default (defined here only)."""

    dir: str | None = None  # None: no per-rollout records
    max_bytes: int = 64 * 1024 * 1024
    max_files: int = 4
    thumbnails: bool = True  # a small PNG per distinct image in dir/thumbnails (verl_ext.telemetry.thumbnails)


@dataclass(frozen=True)
class LoopOptions:
    """``verl_ext``: each field is an option key with its default (defined here only; ``check`` is ``CheckPolicy``,
    ``records`` is ``RecordsOptions``, ``harness`` is ``HarnessOptions``: read by ``verl_ext_gateway_agent`` only)."""

    check: CheckPolicy = field(default_factory=CheckPolicy)
    records: RecordsOptions = field(default_factory=RecordsOptions)
    escape_special_tokens: bool = True  # special-token text in tool/user content stays text
    tool_timeout_s: float = 30.0
    extra_stop_tokens: tuple[str, ...] = ()  # stop tokens the engine is configured with beyond the template's
    agent_name_column: AgentNameColumn = AgentNameColumn.SWITCH
    harness: HarnessOptions = field(default_factory=HarnessOptions)
    # The numerics view's thresholds and depth buckets (verl_ext.core.numerics; docs/numerics.md justifies them)
    numerics: NumericsOptions = field(default_factory=NumericsOptions)
    # Async trainers: sampled tokens whose version lags the trained step by more than this many versions get loss
    # mask 0, counted (tito/async/masked_stale_tokens); None: off. verl's own staleness_threshold drops whole
    # samples and rollout_correction reweights tokens: docs/async.md says how not to correct twice.
    max_token_lag: int | None = None

    @classmethod
    def from_sources(cls, *sources: Mapping[str, Any] | None) -> LoopOptions:
        """Merge the sources in order (later wins; None is skipped), then ``from_mapping``. Raises ``OptionsError``
        for a source that is not a mapping, an unknown key or a bad value."""
        merged: dict[str, Any] = {}
        for source in sources:
            if source is None:
                continue
            source = _plain(source)
            if not isinstance(source, Mapping):
                raise OptionsError(_not_a_mapping(source))
            _merge(merged, source)
        return cls.from_mapping(merged)

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> LoopOptions:
        """Validated options; an absent key takes its default. Raises ``OptionsError`` naming the key and the fix."""
        if not isinstance(options, Mapping):
            raise OptionsError(_not_a_mapping(options))
        reject_unknown("verl_ext", options, _KNOWN[""])
        check = {} if options.get("check") is None else options["check"]
        records = {} if options.get("records") is None else options["records"]
        for name, section in (("check", check), ("records", records)):
            if not isinstance(section, Mapping):  # `check: []` or `records: false` must not mean "the defaults"
                raise OptionsError(
                    f"verl_ext.{name} must be a mapping of options (or null for the defaults), got {section!r}; "
                    f"set single keys, e.g. verl_ext.{name}.{sorted(_KNOWN[name])[0]}=..."
                )
        policy = CheckPolicy.from_mapping(check)  # CheckPolicy owns verl_ext.check's keys and their rules
        reject_unknown("verl_ext.records", records, _KNOWN["records"])
        records_dir = records.get("dir")
        if isinstance(records_dir, os.PathLike):
            records_dir = os.fspath(records_dir)
        if records_dir is not None and not isinstance(records_dir, str):
            raise OptionsError(
                f"verl_ext.records.dir must be a folder path (a string) or null, got {records_dir!r}; e.g. "
                "verl_ext.records.dir=/tmp/records"
            )
        d, r = _DEFAULTS, _DEFAULTS.records  # an absent key takes the dataclass default: defaults live there only
        return cls(
            check=policy,
            records=RecordsOptions(
                dir=records_dir or None,
                max_bytes=_positive_int("verl_ext.records.max_bytes", records.get("max_bytes", r.max_bytes)),
                max_files=_positive_int("verl_ext.records.max_files", records.get("max_files", r.max_files)),
                thumbnails=_bool("verl_ext.records.thumbnails", records.get("thumbnails", r.thumbnails)),
            ),
            escape_special_tokens=_bool(
                "verl_ext.escape_special_tokens", options.get("escape_special_tokens", d.escape_special_tokens)
            ),
            tool_timeout_s=_positive_float("verl_ext.tool_timeout_s", options.get("tool_timeout_s", d.tool_timeout_s)),
            extra_stop_tokens=_stop_tokens(options.get("extra_stop_tokens", d.extra_stop_tokens)),
            agent_name_column=choice(
                "verl_ext.agent_name_column", AgentNameColumn, options.get("agent_name_column", d.agent_name_column)
            ),
            harness=HarnessOptions.from_mapping(options.get("harness")),  # its keys and rules live in HarnessOptions
            numerics=_numerics(options.get("numerics")),
            max_token_lag=_lag("verl_ext.max_token_lag", options.get("max_token_lag", d.max_token_lag)),
        )


_DEFAULTS = LoopOptions()
# The option keys, from the dataclasses' fields (the one place each option and its default is defined);
# configs/verl_ext/warn.yaml lists every one with its default (gateway.yaml the harness's), and a test holds them
# to these.
_KNOWN: dict[str, set[str]] = {
    "": {f.name for f in fields(LoopOptions)},
    "check": {f.name for f in fields(CheckPolicy)},
    "records": {f.name for f in fields(RecordsOptions)},
    "harness": {f.name for f in fields(HarnessOptions)},
    "numerics": {f.name for f in fields(NumericsOptions)},
}


def _numerics(section: Any) -> NumericsOptions:
    """``verl_ext.numerics``: ``NumericsOptions.problems`` owns the rules; the first problem is the error."""
    if section is None:
        return NumericsOptions()
    if not isinstance(section, Mapping):
        raise OptionsError(
            f"verl_ext.numerics must be a mapping of options (or null for the defaults), got {section!r}; set "
            "single keys, e.g. verl_ext.numerics.drift_mean_abs_delta=0.05"
        )
    reject_unknown("verl_ext.numerics", section, _KNOWN["numerics"])
    d = _DEFAULTS.numerics
    edges = section.get("depth_edges", d.depth_edges)
    options = NumericsOptions(
        depth_edges=tuple(edges) if isinstance(edges, list | tuple) else edges,
        drift_mean_abs_delta=section.get("drift_mean_abs_delta", d.drift_mean_abs_delta),
        token_abs_delta=section.get("token_abs_delta", d.token_abs_delta),
        policy=section.get("policy", d.policy),
        refeed_fraction=section.get("refeed_fraction", d.refeed_fraction),
    )
    problems = options.problems("verl_ext.numerics")
    if problems:
        raise OptionsError(problems[0])
    return NumericsOptions(
        options.depth_edges,
        float(options.drift_mean_abs_delta),
        float(options.token_abs_delta),
        policy=options.policy,
        refeed_fraction=float(options.refeed_fraction),
    )


def _not_a_mapping(value: Any) -> str:
    hint = ""
    if isinstance(value, str):
        # `+verl_ext=strict` without verl_ext's Hydra config group on the search path adds the plain string
        hint = (
            f" `+verl_ext={value}` selects a preset only when Hydra finds verl_ext's config group: add "
            "`hydra.searchpath=[pkg://verl_ext.configs]` to the command line (the installed verl_ext adds it by "
            "itself; see docs/verl-integration.md), or set single options with `+verl_ext.check.mode=strict`."
        )
    return f"verl_ext must be a mapping of options, got {value!r}.{hint}"


def _plain(value: Any) -> Any:
    """OmegaConf containers to plain dicts/lists, without importing omegaconf here."""
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [_plain(v) for v in value]
    return value


def _merge(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def _stop_tokens(value: Any) -> tuple[str, ...]:
    """``extra_stop_tokens``: a list of token texts. A bare string would be taken letter by letter, and an id
    would be encoded as its digits, so both are refused."""
    if value is None:
        return ()
    example = """e.g. 'verl_ext.extra_stop_tokens=["</tool_call>"]'"""  # quoted: pasted into bash, as typed
    if not isinstance(value, (list, tuple)):
        raise OptionsError(f"verl_ext.extra_stop_tokens must be a list of token strings, got {value!r}; {example}")
    for k, token in enumerate(value):
        if not isinstance(token, str) or not token:
            raise OptionsError(
                f"verl_ext.extra_stop_tokens[{k}] must be a token's text (a non-empty string), got {token!r}; {example}"
            )
    return tuple(value)


def _bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise OptionsError(f"{key} must be true or false, got {value!r}")


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise OptionsError(f"{key} must be a positive integer, got {value!r}")
    return value


def _lag(key: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise OptionsError(
            f"{key} must be a whole number of versions (0 or more) or null (off), got {value!r}; e.g. {key}=2 masks "
            "tokens more than 2 weight updates older than the step that trains them"
        )
    return value


def _positive_float(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
        raise OptionsError(f"{key} must be a positive finite number, got {value!r}")
    return float(value)
