"""Every process-wide cache has a stated bound: a training job runs for days in the same worker processes, and a
module-level dict that gains an entry per new key (a template, a message shape, a tokenizer object, an event loop)
grows without end. Each is an ``LruCache`` of a stated size, or per object (a ``WeakKeyDictionary``)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from verl_ext.core.bounded_cache import LruCache

PACKAGE = Path(__file__).resolve().parents[2] / "verl_ext"

# module -> its process-wide caches (each was an unbounded dict before)
CACHES = {
    "verl_ext.core.probe": ("_PROFILE_CACHE", "_NAMED_CACHE"),
    "verl_ext.check.template_marks": ("_FRAMES", "_PROMPT_TAILS", "_CALL_MARKERS"),
    "verl_ext.check.message_shape": ("_SHAPES",),
    "verl_ext.plugin.agent_loop": ("_RUNTIMES",),
    "verl_ext.plugin.gateway_loop": ("_WORKERS",),
}
_CONTAINERS = {"dict", "list", "set", "OrderedDict", "defaultdict", "Counter", "deque"}
_PER_OBJECT = {"WeakKeyDictionary", "WeakValueDictionary"}


def unbounded_caches(root: Path) -> list[str]:
    """Module-level names bound to an empty dict, list or set (``{}``, ``dict()``, ``defaultdict(...)``, ...), and
    ``functools.cache`` or ``lru_cache(maxsize=None)`` anywhere: one line each."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        where = path.relative_to(root.parent)
        for node in tree.body:
            value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
            target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
            if value is None or target is None:
                continue
            literal = isinstance(value, ast.Dict | ast.List | ast.Set) and not (
                getattr(value, "keys", None) or getattr(value, "elts", None)
            )
            called = isinstance(value, ast.Call) and ast.unparse(value.func).split(".")[-1] in _CONTAINERS
            if literal or called:
                found.append(f"{where}:{node.lineno}: {ast.unparse(target)} is an unbounded module-level container")
        for node in ast.walk(tree):
            text = ast.unparse(node) if isinstance(node, ast.Call | ast.Attribute | ast.Name) else ""
            if text in ("functools.cache", "cache") or ("lru_cache(" in text and "maxsize=None" in text):
                found.append(f"{where}:{node.lineno}: {text} has no bound")
    return found


def test_no_process_wide_cache_is_unbounded():
    found = unbounded_caches(PACKAGE)
    assert not found, "make each an LruCache with a stated maxsize (verl_ext.core.bounded_cache):\n" + "\n".join(found)


def test_the_scan_finds_an_unbounded_cache(tmp_path):
    """The scan above can fail: a module-level ``{}``, a ``defaultdict`` and ``functools.cache`` are found; a
    WeakKeyDictionary (per object), a filled constant table and an ``LruCache`` are not."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text(
        "import collections, functools, weakref\n"
        "from verl_ext.core.bounded_cache import LruCache\n"
        "_SEEN: dict[str, int] = {}\n"
        "_BY = collections.defaultdict(list)\n"
        "_OBJ = weakref.WeakKeyDictionary()\n"
        "TABLE = {'a': 1}\n"
        "_OK = LruCache('ok', 4)\n"
        "@functools.cache\ndef f(x):\n    return x\n"
    )
    found = "\n".join(unbounded_caches(pkg))
    assert "_SEEN" in found and "_BY" in found and "functools.cache" in found
    assert "_OBJ" not in found and "TABLE" not in found and "_OK" not in found


@pytest.mark.parametrize(("module", "name"), [(m, n) for m, names in CACHES.items() for n in names])
def test_each_process_wide_cache_states_its_bound(module, name):
    cache = getattr(importlib.import_module(module), name)
    assert isinstance(cache, LruCache) and 1 <= cache.maxsize <= 1024, (module, name)


def test_an_lru_cache_keeps_its_size_and_drops_the_least_recently_used():
    cache: LruCache[int, int] = LruCache("test", 3)
    for key in range(3):
        cache[key] = key
    assert cache.get(0) == 0  # 0 is now the most recently used: 1 goes first
    made = [cache.get_or_make(key, lambda key=key: key * 10) for key in range(3, 10)]
    assert len(cache) == 3 and made == [30, 40, 50, 60, 70, 80, 90]
    assert 1 not in cache and list(cache) == [7, 8, 9]
    assert cache.get_or_make(9, lambda: -1) == 90  # kept: not made again
    with pytest.raises(ValueError, match="maxsize must be at least 1"):
        LruCache("none", 0)


def test_message_shapes_stay_within_their_bound_over_many_shapes(renderer_for, monkeypatch):
    """The one cache a long run feeds new keys all the time (each new shape of tool-call arguments): past its bound
    the oldest shapes go, and a shape asked again is the same."""
    from verl_ext.check import message_shape as module
    from verl_ext.core.probe import probe_template

    r = renderer_for("qwen3")
    profile = probe_template(r)
    small: LruCache[tuple[str, str], tuple[str, ...]] = LruCache("message shapes", 4)
    monkeypatch.setattr(module, "_SHAPES", small)

    def call(arguments: int) -> dict[str, object]:  # a tool call of that many arguments: a shape of its own
        function = {"name": "f", "arguments": {f"a{i}": i for i in range(arguments)}}
        return {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c1", "type": "function", "function": function}],
        }

    first = module.message_shape(r, profile, call(1))
    for n in range(2, 12):
        module.message_shape(r, profile, call(n))
    assert len(small) == 4
    assert module.message_shape(r, profile, call(1)) == first
