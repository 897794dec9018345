"""A record line's JSON, typed: ``JsonFields`` reads one JSON object's keys, each wrong type a one-line RecordError
naming where (file:line), the key and the fix; ``read_version`` reads a line's schema version; ``json_safe`` writes
a float that is not finite as the string schema version 2 defines (``"NaN"``, ``"Infinity"``, ``"-Infinity"``).

The rollout line (``check/record.py``) and the header line (``check/record_header.py``) both read through it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import fields
from typing import Any

from verl_ext.core.messages import json_type
from verl_ext.core.replay import NON_FINITE_JSON, SCHEMA_VERSION, RecordError, unknown_key_error


def plain_json(value: Any) -> Any:
    """``value`` as JSON reads it back (tuples as lists, mappings as dicts): ``TemplateProfile.to_dict`` holds
    tuples, which the typed reads (written for parsed JSON) would refuse as "not a list"."""
    return json.loads(json.dumps(value, default=lambda o: dict(o) if isinstance(o, Mapping) else str(o)))


def json_objects(f: JsonFields, key: str, typed: type | None = None) -> Iterator[JsonFields]:
    """The JSON objects of the list at ``key`` (none when it is missing), each ready for typed reads; one at a time,
    so the first problem in file order is the one reported (an item that is no object, or a bad key of one). With
    ``typed`` (a dataclass), a key that is not one of its fields is refused."""
    for k, item in enumerate(f.list(key, default=[])):
        g = JsonFields(item, f.where, f"{f._key(key)}[{k}]")
        if typed is not None:
            g.only({x.name for x in fields(typed)}, f"{f._key(key)}[{k}]")
        yield g


def read_version(f: JsonFields, where: str) -> int:
    """The line's schema version: 1 when it has none (files from before it was written)."""
    version = f.int("version", default=1)
    if version < 1:
        raise f.error("version", "a positive integer", version)
    if version > SCHEMA_VERSION:
        raise RecordError(
            f"{where}: record schema version {version} is newer than this verl_ext reads (up to {SCHEMA_VERSION}); "
            "upgrade verl_ext to read it"
        )
    return version


_MISSING: Any = object()
_NON_FINITE_NAMES = 'or "NaN", "Infinity", "-Infinity"'


class JsonFields:
    """Typed reads of one JSON object's keys; each wrong type is a RecordError naming where, the key and the fix.
    A missing key (or null) takes its default; ``default=_MISSING`` makes it required."""

    def __init__(self, obj: Any, where: str, path: str) -> None:
        if not isinstance(obj, dict):
            raise RecordError(f"{where}: {path or 'the record'} must be a JSON object, got {json_type(obj)}")
        self.obj, self.where, self.path = obj, where, path

    def _key(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def only(self, known: Collection[str], what: str) -> None:
        """Refuse a key not in ``known`` (a misspelled key would otherwise be read as missing, with its default)."""
        for key in self.obj:
            if key not in known:
                raise unknown_key_error(self.where, key, sorted(known), what, f"{self.path}." if self.path else "")

    def error(self, key: str, expected: str, value: Any) -> RecordError:
        return RecordError(
            f"{self.where}: {self._key(key)!r} must be {expected}, got {json_type(value)} ({_short(value)}); "
            "fix or remove that key (records are written by verl_ext.records.dir, see docs/check.md)"
        )

    def _get(self, key: str, default: Any) -> Any:
        value = self.obj.get(key)
        if value is None:
            if default is _MISSING:
                raise RecordError(f"{self.where}: {self._key(key)!r} is missing; records written by verl_ext have it")
            return _MISSING
        return value

    def _typed(self, key: str, default: Any, ok: Callable[[Any], bool], expected: str) -> Any:
        value = self._get(key, default)
        if value is _MISSING:
            return default
        if not ok(value):
            raise self.error(key, expected, value)
        return value

    def int(self, key: str, default: Any = _MISSING) -> Any:
        return self._typed(key, default, _is_int, "an integer")

    def count(self, key: str, value: Any) -> int:
        if not _is_int(value):
            raise self.error(key, "an integer", value)
        return int(value)

    def bool(self, key: str, default: Any = _MISSING) -> Any:
        return self._typed(key, default, lambda v: isinstance(v, bool), "true or false")

    def str(self, key: str, default: Any = _MISSING) -> Any:
        return self._typed(key, default, lambda v: isinstance(v, str), "a string")

    def float(self, key: str, default: Any = _MISSING) -> Any:
        value = self._typed(key, default, _is_float, f"a number ({_NON_FINITE_NAMES})")
        return value if value is default else _float(value)

    def list(self, key: str, default: Any = _MISSING) -> Any:
        return self._typed(key, default, lambda v: isinstance(v, list), "a list")

    def dict(self, key: str, default: Any = _MISSING) -> Any:
        return self._typed(key, default, lambda v: isinstance(v, dict), "an object")

    def span(self, key: str) -> tuple[int, int]:
        value = self._typed(
            key,
            [0, 0],
            lambda v: isinstance(v, list) and len(v) == 2 and all(map(_is_int, v)),
            "[start, end] (two integers)",
        )
        return (int(value[0]), int(value[1]))

    def _items(self, key: str, default: Any, ok: Callable[[Any], bool], one: str, many: str) -> Any:
        """A list whose every item passes ``ok`` (the error names the first that does not)."""
        value = self._get(key, default)
        if value is _MISSING:
            return default
        if not isinstance(value, list):
            raise self.error(key, f"a list of {many}", value)
        for k, item in enumerate(value):
            if not ok(item):
                raise self.error(f"{key}[{k}]", one, item)
        return value

    def ints(self, key: str, default: Any = _MISSING) -> Any:
        value = self._get(key, default)
        if isinstance(value, list) and all(type(v) is int for v in value):  # the common case, at C speed
            return tuple(value)
        value = self._items(key, default, _is_int, "an integer", "integers")
        return value if value is default else tuple(value)

    def floats(self, key: str, default: Any = _MISSING) -> Any:
        value = self._get(key, default)
        if isinstance(value, list) and all(type(v) is float for v in value):  # the common case, at C speed
            return tuple(value)
        value = self._items(
            key, default, _is_float, f"a number ({_NON_FINITE_NAMES})", f"numbers ({_NON_FINITE_NAMES})"
        )
        return value if value is default else tuple(_float(x) for x in value)

    def strs(self, key: str, default: Any = _MISSING) -> Any:
        value = self._get(key, default)
        if isinstance(value, list) and all(type(v) is str for v in value):
            return tuple(value)
        value = self._items(key, default, lambda v: isinstance(v, str), "a string", "strings")
        return value if value is default else tuple(value)

    def by_index(self, key: str, read: str) -> dict[int, Any]:
        """An object keyed by assistant message index (``"3"``), each value read by the method named ``read``
        (``"ints"``, ``"floats"``)."""
        raw = self.dict(key, default={})
        inner = JsonFields(raw, self.where, self._key(key))
        out = {}
        for k in raw:
            if not (k.isascii() and k.isdigit()):
                raise RecordError(f'{self.where}: {self._key(key)!r} key {k!r} is not a message index (write "1")')
            out[int(k)] = getattr(inner, read)(k)
        return out


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_float(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)) or (
        isinstance(value, str) and value in NON_FINITE_JSON
    )


def _float(value: Any) -> float:
    return NON_FINITE_JSON[value] if isinstance(value, str) else float(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def json_safe(value: Any) -> Any:
    """``value`` with every float that is not finite replaced by ``"NaN"``, ``"Infinity"`` or ``"-Infinity"``, so
    ``json.dumps(..., allow_nan=False)`` writes valid JSON (schema version 2)."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value
