"""One assistant turn from the engine, whole: an aborted or cut output is continued, never trained as a half turn.

verl pauses SGLang with ``pause_generation(mode="abort")`` for weight syncs and partial rollouts: an in-flight request
returns its partial output with ``stop_reason`` ``abort``. verl_ext's SGLang server also marks an output incomplete
when its logprobs do not cover all its ids (it keeps the covered prefix). Either way the turn is continued: the next
engine call's prompt is the turn's prompt + the ids so far, its budget what is left, and the outputs are joined
(logprobs kept) into one turn, recorded as one engine call whose output spans the calls (``segments``: one dict
per call, keys defined in ``verl_ext.core.version_spans``: ids and start, stop reason, the versions stamped at
dispatch and at stop, its own logprobs, ids the id check cut). If the turn cannot be completed (the engine
returns no new ids for ``STALL_TIMEOUT_S``, or the rollout server is gone), the rollout ends with an error that
says so: nothing of it reaches training.

The joined output's ``verl_ext_engine`` report describes the joined output (``joined_report``): how the last attempt
ended (``complete`` where it completed), counts over all attempts, what the first received; each attempt's own report
is kept under its ``attempts`` key. ``resume_aborts=False`` (verl's ``async_training.partial_rollout: false``, read by
``plugin.trainer_mode.resumes_aborted_requests``) hands an aborted attempt back as the turn, as verl's client does.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from verl_ext.core.errors import VerlExtError
from verl_ext.core.version_spans import DISPATCH_VERSION_FIELD, PROMPT_CRC_FIELD, segment
from verl_ext.engines.sglang_images import ImagePromptRebuildError
from verl_ext.engines.sglang_output import ABORT_REASONS, ENGINE_FIELD

log = logging.getLogger("verl_ext.plugin")

# A call that adds ids is progress: a turn is continued across any number of aborts (one per weight update under
# verl's async trainers, as verl's own resume client does), bounded by its budget since each call adds an id. Calls
# that return no ids (a replica rejecting requests while it trains) are retried with a growing wait, as verl's client
# retries them, until the turn has had none for STALL_TIMEOUT_S: longer than a weight update, then the rollout ends.
STALL_TIMEOUT_S = 600.0
_STALL_WAITS_S = (0.05, 0.1, 0.25, 0.5, 1.0)  # between calls that returned no ids; then 1 s each

ATTEMPTS_KEY = "attempts"  # the joined report's key: each attempt's own engine report, in order
# a joined report's counts are the attempts' sums; what the engine received with the turn's prompt is the first's
_SUMMED_KEYS = ("returned_ids", "kept_ids", "logprob_entries", "completion_tokens")
_FIRST_KEYS = ("prompt_tokens", "cached_tokens", DISPATCH_VERSION_FIELD, PROMPT_CRC_FIELD)


class RolloutInterrupted(VerlExtError, RuntimeError):
    """A turn could not be completed; the rollout is dropped with this error rather than trained half-done."""


@dataclass
class TurnOutput:
    """One assistant turn's engine output: ids, logprobs and stop reason over all its engine calls (a turn may take
    several)."""

    token_ids: list[int]
    log_probs: list[float] | None
    stop_reason: str | None
    extra_fields: dict[str, Any]  # the first call's (verl merges turns' fields from the first)
    segments: list[dict[str, Any]] = field(default_factory=list)  # one per engine call
    # The images passed to the server manager as ``image_data`` with each of the turn's engine calls (the same list
    # each time); None: none were passed for a loop that sends no images (a text model), [] for a VL loop's prompt
    # without any. The engine call's record keeps their digests.
    images: list[Any] | None = None


def _incomplete(out: Any) -> bool:
    engine = (out.extra_fields or {}).get(ENGINE_FIELD) or {}
    return str(out.stop_reason) in ABORT_REASONS or engine.get("complete") is False


def joined_report(reports: Sequence[Mapping[str, Any]], complete: bool) -> dict[str, Any]:
    """The engine report of a turn joined from several attempts' outputs: how it ended is the last attempt's (finish,
    stop version, ``complete``: whether the last attempt completed), the counts are summed over the attempts, the
    prompt it was sent with (tokens, cache hits, dispatch version, CRC) is the first's, the ids match their logprobs
    where every attempt's do; each attempt's own report is kept, in order, under ``ATTEMPTS_KEY``."""
    first, out = reports[0], dict(reports[-1])
    for key in _FIRST_KEYS:
        out.pop(key, None)
        if key in first:
            out[key] = first[key]
    for key in _SUMMED_KEYS:
        values = [r.get(key) for r in reports]
        if any(key in r for r in reports):
            ints = all(isinstance(v, int) and not isinstance(v, bool) for v in values)
            out[key] = sum(values) if ints else None  # type: ignore[arg-type]  # ints checked
    if any("ids_match_logprobs" in r for r in reports):
        out["ids_match_logprobs"] = all(r.get("ids_match_logprobs") is not False for r in reports)
        out["id_check_detail"] = next((r["id_check_detail"] for r in reports if r.get("id_check_detail")), "")
    out["complete"] = complete
    out[ATTEMPTS_KEY] = [dict(r) for r in reports]
    return out


def _count_engine_report(report: Mapping[str, Any], counters: Counter[str]) -> None:
    if not report:
        return
    if report.get("ids_match_logprobs") is False:
        counters["engine/logprob_id_mismatch"] += 1
        counters["engine/ids_cut_by_id_check"] += int(report.get("returned_ids", 0)) - int(report.get("kept_ids", 0))
    if report.get("finish_consistent") is False:
        counters["engine/finish_reason_mismatch"] += 1


async def generate_turn(
    server_manager: Any,
    request_id: str,
    prompt_ids: Sequence[int],
    sampling_params: Mapping[str, Any],
    budget: int,
    counters: Counter[str],
    image_data: list[Any] | None = None,
    *,
    resume_aborts: bool = True,
) -> TurnOutput:
    """Ask the engine for one turn of at most ``budget`` tokens, continuing it while the engine returns it partial.
    ``image_data``: every image of the prompt, in placeholder order (None: a loop without images); the output's
    ``images`` is the list passed. ``resume_aborts=False``: an aborted call ends the turn, aborted (verl's client
    under ``partial_rollout: false``); an output the id check cut is continued all the same."""
    ids: list[int] = []
    logprobs: list[float] | None = []
    segments: list[dict[str, Any]] = []
    reports: list[Mapping[str, Any]] = []  # each call's engine report ({} where the engine gives none)
    first_extra: dict[str, Any] | None = None
    out: Any = None
    sent = None if image_data is None else list(image_data)  # what every call of the turn passes, and records
    stall = _Stall()
    while True:
        params = {**sampling_params, "max_tokens": budget - len(ids)}
        out = await _generate(server_manager, request_id, [*prompt_ids, *ids], params, len(ids), counters, sent)
        new = [int(i) for i in out.token_ids]
        extra = dict(out.extra_fields or {})
        first_extra = extra if first_extra is None else first_extra
        report = extra.get(ENGINE_FIELD) or {}
        _count_engine_report(report, counters)
        reports.append(report)
        # one segment per call (keys: verl_ext.core.version_spans): its own start, logprobs, stamps and cut ids
        segments.append(segment(len(ids), new, out.stop_reason, not _incomplete(out), report, extra, out.log_probs))
        ids += new
        if logprobs is not None and out.log_probs is not None:
            logprobs += [float(x) for x in out.log_probs]
        else:
            logprobs = None
        if not _incomplete(out) or len(ids) >= budget:
            break
        if not resume_aborts and str(out.stop_reason) in ABORT_REASONS:
            counters["engine/aborted_turns_not_resumed"] += 1
            break
        counters["engine/continued_calls"] += 1
        await stall.after(bool(new), counters, f"{out.stop_reason!r}, {len(ids)} of at most {budget} tokens")
        log.info(
            "verl_ext: turn output incomplete (%s after %d ids); continuing it (call %d)",
            out.stop_reason,
            len(ids),
            len(segments) + 1,
        )
    if len(segments) > 1:
        counters["engine/continued_turns"] += 1
        first_extra = _joined_extra(first_extra or {}, out.extra_fields or {}, reports, not _incomplete(out))
    return TurnOutput(ids, logprobs, out.stop_reason, first_extra or {}, segments, sent)


@dataclass
class _Stall:
    """Calls in a row of one turn that returned no ids, and since when."""

    calls: int = 0
    since: float = 0.0

    async def after(self, progressed: bool, counters: Counter[str], where: str) -> None:
        """After an incomplete call: wait before the next one where it returned no ids (a growing wait); raise
        ``RolloutInterrupted`` once the turn has had no new id for ``STALL_TIMEOUT_S``. ``where``: the last stop
        reason and the turn's tokens, for the message."""
        if progressed:
            self.calls = 0
            return
        self.since = time.monotonic() if self.calls == 0 else self.since
        self.calls += 1
        if time.monotonic() - self.since >= STALL_TIMEOUT_S:
            counters["engine/interrupted_turns"] += 1
            raise RolloutInterrupted(
                f"verl_ext: a turn got no new ids from the engine in {self.calls} calls over {STALL_TIMEOUT_S:.0f} s "
                f"(last stop reason {where}); the rollout is dropped rather than trained on a half turn. "
                "Check that the rollout servers resume after the weight update."
            )
        await asyncio.sleep(_STALL_WAITS_S[min(self.calls, len(_STALL_WAITS_S)) - 1])


def _joined_extra(
    first: Mapping[str, Any], last: Mapping[str, Any], reports: Sequence[Mapping[str, Any]], complete: bool
) -> dict[str, Any]:
    """A turn of several calls: the first call's extra fields (verl merges turns' fields from the first), with
    verl's ``max_global_steps`` the last call's (as verl's resume client keeps it: its staleness reads it) and the
    joined output's engine report (``joined_report``), where any call had one."""
    out = {**first, "max_global_steps": last.get("max_global_steps", last.get("global_steps"))}
    if any(reports):
        out[ENGINE_FIELD] = joined_report(reports, complete)
    return out


async def _generate(
    server_manager: Any,
    request_id: str,
    prompt_ids: list[int],
    params: Mapping[str, Any],
    done: int,
    counters: Counter[str],
    image_data: list[Any] | None = None,
) -> Any:
    """One engine call. A Ray failure (the server crashed or was killed) raises ``RolloutInterrupted`` naming the
    ``done`` tokens of the turn it loses. An image prompt the SGLang server refused (SGLang would have run it on
    other ids, sglang_images.py; nothing was sent) is counted as ``engine/image_prompt_refused`` and raised as the
    server's ``ImagePromptRebuildError`` (unwrapped from Ray's error): the loop ends the rollout before that turn.
    Any other error is raised as it is."""
    try:
        images = {"image_data": image_data} if image_data else {}  # every image of the prompt, in placeholder order
        # verl_ext's resume client (resume_client.py) answers one attempt, never resumed: this loop continues it
        call = getattr(server_manager, "generate_attempt", None) or server_manager.generate
        return await call(request_id=request_id, prompt_ids=prompt_ids, sampling_params=params, **images)
    except Exception as exc:
        refused = _image_prompt_refusal(exc)
        if refused is not None:  # nothing was sent: the loop ends the rollout before this turn
            counters["engine/image_prompt_refused"] += 1
            if refused is exc:
                raise
            raise refused from exc
        if not _is_ray_failure(exc):
            raise
        counters["engine/server_failures"] += 1
        raise RolloutInterrupted(
            f"verl_ext: the rollout server failed during a turn ({type(exc).__name__}: {exc}); the rollout is "
            f"dropped, none of its {done} tokens of this turn is trained. Check the rollout server's log "
            "(an engine crash, out of memory, or a killed actor)."
        ) from exc


def _image_prompt_refusal(exc: BaseException) -> ImagePromptRebuildError | None:
    """The server's refusal of an image prompt: raised in process, or the cause of the Ray error it came in."""
    for candidate in (getattr(exc, "cause", None), exc):
        if isinstance(candidate, ImagePromptRebuildError):
            return candidate
    return None


def _is_ray_failure(exc: BaseException) -> bool:
    try:
        from ray.exceptions import RayError
    except ImportError:
        return False
    return isinstance(exc, RayError)
