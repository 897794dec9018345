"""The agent loop's re-feed audit (``verl_ext.numerics.refeed_fraction``): at the end of a rollout, before the next
weight update, re-score an audited rollout on the server that sampled it and write the comparison as a ``numerics``
line (source ``"refeed"``) beside the rollout's record line.

The server is the one verl's client routed the rollout's turns to: ``LLMServerClient._acquire_server`` with the
rollout's request id is verl's sticky routing (the same id lands on the same server while it is in the pool), and
gives that server's handle, whose ``score`` (the CPU engine's and verl_ext's SGLang server's) is called as its
``generate`` is. verl has no public call for this; the two private methods are the only dependency on its client.
Each server's scoring path is proven once per worker process by the canary (``RefeedAuditor``) before its first
audited rollout; a refused path is counted (``tito/numerics/refeed_refused``) per audited rollout and never used.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from verl_ext.check.record import Rollout
from verl_ext.core.bounded_cache import LruCache
from verl_ext.core.numerics import NumericsOptions
from verl_ext.core.refeed import CPU_SCORING_TOLERANCE, RefeedResult, audited
from verl_ext.engines.refeed_audit import RefeedAuditor
from verl_ext.plugin import metrics_sink
from verl_ext.runtime.rollout_runtime import WRITE_FAILURES, RolloutRuntime
from verl_ext.telemetry.records import numerics_record

log = logging.getLogger("verl_ext.plugin")

REFUSED = "numerics/refeed_refused"  # an audited rollout whose server's scoring path the canary refused
NOT_COMPARED = "numerics/refeed_not_compared"  # an audited rollout scored, but not comparable (another version, ids)
AUDITED = "numerics/refeed_audited"  # an audited rollout compared (its numerics line written where records are on)

# The engines whose prefill-vs-generation gap was measured (core/refeed.py); others are refused with the reason.
TOLERANCES = {"verl_ext_cpu": CPU_SCORING_TOLERANCE}

# (engine, server id, options) -> its auditor, once per worker process: the canary runs once per server. A job has
# a few servers and one set of options; verl never renames a server, so this does not grow with steps.
_AUDITORS: LruCache[tuple[str, str, str], RefeedAuditor] = LruCache("re-feed auditors", 256)
_LOGGED: LruCache[str, bool] = LruCache("re-feed refusals logged", 256)  # each reason logged once per worker


def _call(method: Any) -> Callable[..., Awaitable[Any]]:
    """A server method as a coroutine function: a Ray actor handle's ``.remote`` or an in-process server's own."""
    remote = getattr(method, "remote", None)
    if remote is not None:

        async def via_ray(*args: Any, **kwargs: Any) -> Any:
            return await remote(*args, **kwargs)

        return via_ray
    return method  # type: ignore[no-any-return]


def _auditor(engine: str, server_id: str, server: Any, canary_prompt: Sequence[int], options: NumericsOptions) -> Any:
    """The auditor of one server (made once per worker process; its canary runs at its first audit)."""
    key = (engine, server_id, repr(options))
    found = _AUDITORS.get(key)
    if found is not None:
        return found
    generate_call, score_call = _call(server.generate), _call(server.score)

    async def generate(prompt_ids: list[int], params: dict[str, Any]) -> Any:
        canary_id = f"verl-ext-refeed-canary-{server_id}"
        return await generate_call(prompt_ids=prompt_ids, sampling_params=params, request_id=canary_id)

    async def score(ids: list[int], start: int, temperature: float) -> dict[str, Any]:
        return await score_call(ids, start, temperature)  # type: ignore[no-any-return]

    auditor = RefeedAuditor(
        f"{engine} server {server_id}",
        generate,
        score,
        canary_prompt=canary_prompt,
        tolerance=TOLERANCES[engine],
        fraction=options.refeed_fraction,
        options=options,
    )
    _AUDITORS[key] = auditor
    return auditor


async def audit_rollout(
    server_manager: Any,
    request_id: str,
    engine: str,
    rollout: Rollout,
    sampled_version: Any,
    options: NumericsOptions,
    counters: Counter[str],
) -> RefeedResult | None:
    """Re-score ``rollout`` on the server verl routed ``request_id`` to, when it is among the audited fraction; None
    otherwise. Counts what became of it in ``counters`` (``REFUSED``, ``NOT_COMPARED``, ``AUDITED``)."""
    if not audited(rollout.rollout_id, options.refeed_fraction):
        return None
    acquire = getattr(server_manager, "_acquire_server", None)
    why = ""
    if engine not in TOLERANCES:
        why = f"{engine}: no scoring tolerance is calibrated for this engine (measure its prefill-vs-generation gap)"
    elif acquire is None:
        why = f"{engine}: the server manager {type(server_manager).__name__} cannot route to the rollout's server"
    if why:  # refused before any call: nothing is scored
        counters[REFUSED] += 1
        _log_once(why)
        return RefeedResult(rollout.rollout_id, sampled_version, None, None, f"re-feed audit refused: {why}")
    sample = rollout.sample
    if sample.response_logprobs is None:
        counters[NOT_COMPARED] += 1
        _log_once("a rollout without sampled logprobs (set rollout logprobs on) is not compared")
        return RefeedResult(rollout.rollout_id, sampled_version, None, None, "no sampled logprobs to compare")
    server_id, server = await acquire(request_id)
    try:
        auditor = _auditor(engine, str(server_id), server, sample.prompt_ids, options)
        result = await auditor.audit(
            rollout.rollout_id,
            sample.prompt_ids,
            sample.response_ids,
            sample.response_logprobs,
            sample.response_mask,
            rollout.turn_starts,
            sampled_version,
            step=rollout.step,
        )
    finally:
        server_manager._release_server(server_id, request_id=request_id)
    verdict = await auditor.canary()
    if result is None:
        return None
    if not verdict.accepted:
        counters[REFUSED] += 1
        _log_once(verdict.reason)
    elif result.numerics is None:
        counters[NOT_COMPARED] += 1
        _log_once(result.reason)
    else:
        counters[AUDITED] += 1
    return result


def _log_once(reason: str) -> None:
    if reason not in _LOGGED:
        _LOGGED[reason] = True
        log.warning("verl_ext re-feed audit: %s", reason)


def write_refeed_line(rt: RolloutRuntime, result: RefeedResult, options: NumericsOptions) -> bool:
    """Append the audited rollout's ``numerics`` line (source ``"refeed"``) to the record file its rollout line went
    to. Records are diagnostics: a line not written is counted (``tito/records/write_failures``), never raised.
    False when nothing was written (records off, or the write failed)."""
    if rt.writer is None or result.numerics is None:
        return False
    try:
        rt.writer.write(numerics_record(result.numerics, options))
    except (OSError, TypeError, ValueError) as exc:
        failed: Counter[str] = Counter({WRITE_FAILURES: 1})
        metrics_sink.count(failed)  # the rollout's own metrics were reported at its conclusion, just before
        _log_once(f"could not write a refeed numerics line to {rt.writer.path} ({type(exc).__name__}: {exc})")
        return False
    return True
