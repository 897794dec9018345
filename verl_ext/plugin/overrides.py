"""Hydra overrides Hydra's grammar cannot read, explained: the fix as one override to paste.

Hydra reads an unquoted value only when it holds none of the characters its grammar keeps for itself; a chat
template's special tokens hold several (``</tool_call>``, ``<|im_end|>``), so the override
``verl_ext.extra_stop_tokens=[</tool_call>]`` stops the trainer with Hydra's ``LexerNoViableAltException`` and a
caret under a column. ``explain`` writes the override with each string quoted instead (checked to parse), so the
message names the fix; ``check_overrides`` is what ``verl-ext demo`` runs on its overrides before verl's trainer
starts, and ``explain_hydra_errors`` puts the same message in Hydra's own error where verl's trainer is started
directly.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from verl_ext.core.errors import OptionsError

_KEY = re.compile(r"^(?P<key>[+~]{0,2}[\w.@/-]+)=(?P<value>.*)$", re.DOTALL)


def _parses(override: str) -> bool:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:  # parse_rule, not parse_overrides: that is the method explain_hydra_errors wraps
        OverridesParser.create().parse_rule(override, "override")
    except HydraException:
        return False
    return True


def _quoted(item: str) -> str:
    """One value as a double-quoted Hydra string (JSON's escapes are Hydra's for ``"`` and ``\\``)."""
    item = item.strip()
    if len(item) >= 2 and item[0] == item[-1] and item[0] in "'\"":
        return item
    return json.dumps(item, ensure_ascii=False)


def quoted_fix(override: str) -> str | None:
    """``override`` with its value's strings quoted (each element of a ``[...]`` list), or None when that does not
    parse either (or the override has no ``key=value`` shape)."""
    match = _KEY.match(override)
    if match is None:
        return None
    key, value = match["key"], match["value"].strip()
    if value.startswith("[") and value.endswith("]"):
        items = [item for item in value[1:-1].split(",") if item.strip()]
        fixed = f"{key}=[{', '.join(_quoted(item) for item in items)}]"
    else:
        fixed = f"{key}={_quoted(value)}"
    return fixed if fixed != override and _parses(fixed) else None


def explain(override: str) -> str | None:
    """The one-line message for an override Hydra cannot read and quoting fixes; None when Hydra reads it, or when
    quoting is not the fix (Hydra's own message then stands)."""
    if _parses(override):
        return None
    fixed = quoted_fix(override)
    if fixed is None:
        return None
    shell = "'" + fixed.replace("'", "'\\''") + "'"  # pasted into bash as one word: < > | [ ] stay as typed
    return (
        f"Hydra cannot read the override {override!r}: its grammar reads characters such as < > / | in a value only "
        f"inside quotes (a special token such as </tool_call> holds them). Quote each string, and the whole override "
        f"for the shell: {shell}"
    )


def check_overrides(overrides: Sequence[str]) -> None:
    """Raises OptionsError naming the first override Hydra would refuse for want of quotes, with the quoted fix."""
    for override in overrides:
        message = explain(override)
        if message is not None:
            raise OptionsError(message)


def explain_hydra_errors(_hydra: ModuleType | None = None) -> None:
    """Put ``explain``'s message in the error Hydra's override parser raises (a post-import hook of ``hydra``: Hydra
    prints the error's message, without a traceback, and exits). Other parse errors are Hydra's, unchanged."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parse = OverridesParser.parse_overrides
    if getattr(parse, "verl_ext_explained", False):
        return

    @functools.wraps(parse)
    def parse_overrides(self: Any, overrides: list[str]) -> Any:
        try:
            return parse(self, overrides)
        except OverrideParseException as exc:
            message = explain(exc.override)
            if message is None:
                raise
            raise OverrideParseException(override=exc.override, message=message) from None

    parse_overrides.verl_ext_explained = True  # type: ignore[attr-defined]
    OverridesParser.parse_overrides = parse_overrides  # type: ignore[method-assign]


def verl_ext_section(overrides: Sequence[str]) -> dict[str, Any]:
    """The ``verl_ext`` options the overrides set (``verl_ext.check.mode=strict``, ``+verl_ext.records.dir=...``), as
    the nested mapping Hydra would build, each value as Hydra's grammar reads it. Other keys are not looked at, nor
    is ``+verl_ext=NAME``: that selects a preset of verl_ext's Hydra config group (``strict``, ``gateway``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    section: dict[str, Any] = {}
    parser = OverridesParser.create()
    for override in overrides:
        match = _KEY.match(override)
        key = match["key"].lstrip("+~") if match else ""
        if not key.startswith("verl_ext.") or override.startswith("~"):
            continue
        (parsed,) = parser.parse_overrides([override])
        *path, last = key.split(".")[1:]
        into = section
        for part in path:
            into = into.setdefault(part, {}) if isinstance(into.get(part, {}), dict) else {}
        into[last] = parsed.value()
    return section


def check_verl_ext_overrides(overrides: Sequence[str]) -> None:
    """Raises OptionsError for the first ``verl_ext`` option the overrides set that ``LoopOptions`` refuses (an
    unknown key, a bad value), before anything slow starts: verl's trainer would refuse it only once its workers
    build the agent loop, minutes later."""
    from verl_ext.plugin.options import LoopOptions

    section = verl_ext_section(overrides)
    if section:
        LoopOptions.from_sources(section)
