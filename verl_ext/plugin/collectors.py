"""Named Ray actors that collect what loops and trainer ranks report, for the driver to drain once per step
(``metrics_sink``'s check results, ``numerics_sink``'s rollouts' numbers)."""

from __future__ import annotations

from typing import Any

from verl_ext.core.bounded_cache import LruCache

# each named collector's handle, with the Ray job and node it was got in: a process that outlives its cluster
# (ray.shutdown, then ray.init: tests do) gets the new cluster's, never a dead one's
_HANDLES: LruCache[str, tuple[tuple[str, str], Any]] = LruCache("collector actor handles", 8)


def named_collector(cls: type, name: str) -> Any:
    """The job's ``name``d collector actor of ``cls``, created by the first process that reports (0 CPUs: it only
    counts)."""
    import ray

    context = ray.get_runtime_context()
    where = (context.get_job_id(), context.get_node_id())
    known = _HANDLES.get(name)
    if known is None or known[0] != where:
        known = (where, ray.remote(num_cpus=0)(cls).options(name=name, get_if_exists=True).remote())
        _HANDLES[name] = known
    return known[1]
