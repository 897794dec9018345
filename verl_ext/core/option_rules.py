"""The value rules more than one options section uses, each defined once: a bad value raises a one-line
``OptionsError`` that names the option as the user writes it (``verl_ext.check.mode``) and what it accepts.

``check/policy.py`` (the ``verl_ext.check`` section) and ``plugin/options.py`` (every other section) both use them,
so an option gets the same message whichever section it is in and whichever way it reaches its dataclass.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from enum import StrEnum
from typing import Any, TypeVar

from verl_ext.core.errors import OptionsError

__all__ = ["choice", "reject_unknown"]

E = TypeVar("E", bound=StrEnum)


def choice(key: str, enum: type[E], value: Any) -> E:
    """``value`` as a member of ``enum``; anything else (a wrong name, a list, a number) raises ``OptionsError``
    naming ``key`` (the full option key) and the accepted values."""
    try:
        return enum(value)
    except (ValueError, TypeError):  # TypeError: an unhashable value, e.g. a list from `mode: [warn]`
        names = [str(e.value) for e in enum]
        close = difflib.get_close_matches(value, names, n=1) if isinstance(value, str) else []
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise OptionsError(f"{key} must be one of {names}, got {value!r}{hint}") from None


def reject_unknown(where: str, section: Mapping[str, Any], known: set[str]) -> None:
    """Raises ``OptionsError`` for the first (sorted) key of ``section`` not in ``known``, naming it in full
    (``where`` is the section's key, e.g. ``verl_ext.check``), the known keys and the closest one."""
    unknown = sorted(str(k) for k in set(section) - known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(known), n=1)
        hint = f"; did you mean {where}.{close[0]}?" if close else "; use one of them or leave it out"
        raise OptionsError(f"unknown option {where}.{unknown[0]}; known keys under {where}: {sorted(known)}{hint}")
