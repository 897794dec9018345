"""The token-exact half of verl_ext's SGLang server (sglang_server.py), importable without SGLang: the request it
sends and the checks on what SGLang returns.

The server is registered by the plugin for ``actor_rollout_ref.rollout.name=sglang`` (the name stays ``sglang``: verl
compares it in its weight sync, adapters and config checks). It is switched on by the same setting as verl_ext's loop
(``rollout.agent.default_agent_loop`` naming ``verl_ext_tool_agent`` or a subclass, as the ``warn`` and ``strict``
presets do; the ``audit`` preset keeps verl's server); ``VERL_EXT_SGLANG_SERVER`` = ``1``/``0`` forces it on or off.
Everything but ``generate`` is verl's own: launch, weight sync, sleep/wake, abort/resume, profiling. Requests with
images are served here too (sglang_images.py); video, prefill/decode-disaggregated, teacher prompt-logprob and
routing-replay requests are handed to verl's ``generate`` unchanged.

What ``generate`` does differently from verl 0.9.1's:

* always asks SGLang for the output logprobs, and checks that the logprob entries' ids equal ``output_ids`` and that
  their counts agree. verl returns empty ids on a count mismatch (and never compares ids); here the covered prefix is
  kept, the output is marked incomplete and the mismatch is reported (``extra_fields["verl_ext_engine"]``);
* keeps ``output_ids`` exactly as SGLang returns them (the stop token is kept);
* returns the finish reason with the matched stop id, the prompt/completion/cached token counts and the weight
  version, and whether the finish reason agrees with the ids (SGLang 0.5.12 reports ``length`` when the last token
  of a length-capped output is an EOS: the loop decides from the ids);
* rejects stop strings and regexes with a clear error: under ``skip_tokenizer_init`` (verl's default) they crash
  SGLang's scheduler, which has no tokenizer to decode with.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from verl_ext.core.errors import EngineRequestError

log = logging.getLogger("verl_ext.engines")

ENGINE_FIELD = "verl_ext_engine"  # the key of this server's record in TokenOutput.extra_fields
SWITCH_ENV = "VERL_EXT_SGLANG_SERVER"
ABORT_REASONS = frozenset({"abort", "aborted"})
# sampling keys that need a tokenizer inside SGLang's scheduler; verl runs it without one (skip_tokenizer_init)
_TEXT_STOP_KEYS = ("stop", "stop_regex")


class StopStringError(EngineRequestError):
    """A request asked SGLang to stop on text, which its scheduler cannot do without a tokenizer."""


@dataclass(frozen=True)
class EngineReport:
    """What the server learned about one SGLang call (``extra_fields["verl_ext_engine"]``, a plain dict)."""

    finish_type: str | None  # SGLang's finish_reason["type"]: stop | length | abort | None
    matched_stop_id: int | None  # finish_reason["matched"] when it is a token id
    matched_stop_text: str | None  # finish_reason["matched"] when it is text (stop string, "NaN happened")
    finish_length: int | None  # finish_reason["length"] for a length finish
    finish_message: str | None  # an abort's message
    finish_consistent: bool  # the finish reason agrees with the ids (see finish_consistency)
    finish_detail: str  # why not, or ""
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    weight_version: str | None
    returned_ids: int  # len(output_ids) as SGLang returned them
    logprob_entries: int  # len(output_token_logprobs)
    kept_ids: int  # how many ids this server returns (the covered prefix on a mismatch)
    ids_match_logprobs: bool  # entry ids == output ids and the counts agree
    id_check_detail: str  # the first disagreement, or ""
    complete: bool  # False: the output stops short of what the engine meant to return (abort, or ids cut)

    def to_dict(self) -> dict[str, Any]:
        """The report as a JSON-ready dict (one key per field)."""
        return asdict(self)


def forced_switch(environ: Mapping[str, str] | None = None) -> bool | None:
    """What ``VERL_EXT_SGLANG_SERVER`` in ``environ`` (the process environment by default) forces: True (1) or False
    (0), None when unset. Which loop runs decides the rest: that is plugin policy
    (``verl_ext.plugin.loop_routing.server_enabled``), never this layer's."""
    forced = (os.environ if environ is None else environ).get(SWITCH_ENV)
    if forced is None or forced.strip() == "":
        return None
    return forced.strip().lower() not in ("0", "false", "no", "off")


def server_class_name(enabled: bool, environ: Mapping[str, str] | None = None) -> str | None:
    """The name of the server class (sglang_server.py) a replica launches: verl_ext's when ``enabled``, each with
    the TEST/DEMO forced first turn when ``VERL_EXT_SGLANG_FORCE_FIRST_TURN`` is set; ``None`` keeps verl's own."""
    from verl_ext.engines.forced_turn import SGLANG_FORCE_ENV

    env = os.environ if environ is None else environ
    forced = bool(env.get(SGLANG_FORCE_ENV))
    if enabled:
        return "ForcedFirstTurnTokenExactSGLangServer" if forced else "TokenExactSGLangServer"
    return "ForcedFirstTurnStockSGLangServer" if forced else None


def build_request(
    request_id: str,
    prompt_ids: Sequence[int],
    sampling_params: Mapping[str, Any],
    *,
    response_length: int,
    prompt_length: int,
    max_model_len: int,
) -> tuple[dict[str, Any], bool]:
    """SGLang ``GenerateReqInput`` fields for a token-in request, and whether the caller asked for logprobs.

    ``max_tokens`` (vLLM style) or ``max_new_tokens`` wins; without either, verl's default budget. The budget is
    clamped to the context left (``max_model_len - len(prompt) - 1``), as verl does. Logprobs are always requested:
    the id check needs them.
    """
    params = dict(sampling_params)
    text_stops = {k: params[k] for k in _TEXT_STOP_KEYS if params.get(k)}
    if text_stops:
        raise StopStringError(
            f"verl_ext SGLang server: sampling_params {text_stops} ask SGLang to stop on text, which crashes its "
            "scheduler under skip_tokenizer_init (verl's default: there is no tokenizer to decode with). Stop on "
            "token ids instead: put the ids in sampling_params['stop_token_ids'] (e.g. "
            "tokenizer.convert_tokens_to_ids('</tool_call>')), or verl_ext.extra_stop_tokens for the verl_ext loop."
        )
    for key in _TEXT_STOP_KEYS:
        params.pop(key, None)
    ids = [int(i) for i in prompt_ids]
    if not ids:
        raise EngineRequestError(
            "verl_ext SGLang server: empty prompt_ids; a token-in request needs at least one prompt id"
        )
    room = max_model_len - len(ids) - 1
    if room < 0:
        raise EngineRequestError(
            f"verl_ext SGLang server: the prompt has {len(ids)} tokens, more than the model's context "
            f"(rollout.max_model_len={max_model_len}); raise max_model_len or shorten the prompt"
        )
    if "max_new_tokens" in params:
        budget = params.pop("max_new_tokens")
        params.pop("max_tokens", None)
    elif "max_tokens" in params:
        budget = params.pop("max_tokens")
    else:
        budget = min(response_length, prompt_length + response_length - len(ids))
    params["max_new_tokens"] = max(0, min(int(budget), room))
    wants_logprobs = bool(params.pop("logprobs", False))
    if params.get("stop_token_ids"):
        params["stop_token_ids"] = sorted({int(i) for i in params["stop_token_ids"]})
    request = {"rid": request_id, "input_ids": ids, "sampling_params": params, "return_logprob": True}
    return request, wants_logprobs


def id_check(output_ids: Sequence[int], entries: Sequence[Sequence[Any]]) -> tuple[int, str]:
    """How many leading output ids are covered by logprob entries with the same id, and the first disagreement."""
    covered = 0
    for token_id, entry in zip(output_ids, entries, strict=False):
        if len(entry) < 2 or entry[1] is None or int(entry[1]) != int(token_id) or entry[0] is None:
            got = entry[1] if len(entry) >= 2 else entry
            return covered, f"position {covered}: output id {token_id}, logprob entry for id {got}"
        covered += 1
    if len(entries) != len(output_ids):
        return covered, f"{len(output_ids)} output ids but {len(entries)} logprob entries"
    return covered, ""


def finish_consistency(
    finish: Mapping[str, Any] | None, output_ids: Sequence[int], max_new_tokens: int | None
) -> tuple[bool, str]:
    """Does SGLang's finish reason agree with the ids? A stop on a token must end on that token; a length finish
    must have the budget's length. (A length finish whose last id is a stop id is consistent: SGLang 0.5.12 checks
    the length first.)"""
    if not finish:
        return False, "no finish reason"
    kind = finish.get("type")
    if kind == "stop":
        matched = finish.get("matched")
        is_id = isinstance(matched, int) and not isinstance(matched, bool)
        if is_id and (not output_ids or int(output_ids[-1]) != matched):
            last = output_ids[-1] if output_ids else None
            return False, f"finish 'stop' matched id {matched}, but the last output id is {last}"
        return True, ""
    if kind == "length":
        length = finish.get("length", max_new_tokens)
        if length is not None and len(output_ids) != int(length):
            return False, f"finish 'length' {length}, but {len(output_ids)} output ids"
        return True, ""
    if kind in ABORT_REASONS:
        return True, ""
    return False, f"unknown finish reason type {kind!r}"


def engine_report(output: Mapping[str, Any], max_new_tokens: int | None) -> tuple[EngineReport, list[float]]:
    """Check one SGLang output dict (``{"output_ids", "meta_info"}``) and the logprobs of the ids kept."""
    meta = output.get("meta_info") or {}
    ids = [int(i) for i in output.get("output_ids") or []]
    entries = list(meta.get("output_token_logprobs") or [])
    covered, detail = id_check(ids, entries)
    finish = meta.get("finish_reason")
    finish = dict(finish) if isinstance(finish, Mapping) else None
    kind = finish.get("type") if finish else None
    matched = finish.get("matched") if finish else None
    consistent, finish_detail = finish_consistency(finish, ids, max_new_tokens)
    report = EngineReport(
        finish_type=kind,
        matched_stop_id=int(matched) if isinstance(matched, int) and not isinstance(matched, bool) else None,
        matched_stop_text=matched if isinstance(matched, str) else None,
        finish_length=finish.get("length") if finish else None,
        finish_message=finish.get("message") if finish else None,
        finish_consistent=consistent,
        finish_detail=finish_detail,
        prompt_tokens=meta.get("prompt_tokens"),
        completion_tokens=meta.get("completion_tokens"),
        cached_tokens=meta.get("cached_tokens"),
        weight_version=None if meta.get("weight_version") is None else str(meta.get("weight_version")),
        returned_ids=len(ids),
        logprob_entries=len(entries),
        kept_ids=covered,
        ids_match_logprobs=not detail,
        id_check_detail=detail,
        complete=not detail and kind not in ABORT_REASONS,
    )
    return report, [float(entries[i][0]) for i in range(covered)]


def token_output_fields(
    output: Mapping[str, Any],
    *,
    request_id: str,
    prompt_len: int,
    max_new_tokens: int | None,
    wants_logprobs: bool,
    global_steps: Any,
    stamps: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """verl ``TokenOutput`` fields for one SGLang output: the ids the logprobs cover (all of them when the check
    passes), SGLang's finish type as ``stop_reason``, and the report in ``extra_fields["verl_ext_engine"]``, with
    the server's version ``stamps`` (``core.version_spans.engine_stamps``) added to it."""
    report, logprobs = engine_report(output, max_new_tokens)
    ids = [int(i) for i in output.get("output_ids") or []][: report.kept_ids]
    if not report.ids_match_logprobs:
        log.error(
            "verl_ext SGLang server: request %s: logprob entries do not match the output ids (%s); keeping the "
            "%d covered ids of %d and marking the output incomplete",
            request_id,
            report.id_check_detail,
            report.kept_ids,
            report.returned_ids,
        )
    if not report.finish_consistent:
        log.warning("verl_ext SGLang server: request %s: %s", request_id, report.finish_detail)
    if report.prompt_tokens is not None and int(report.prompt_tokens) != prompt_len:
        log.warning(
            "verl_ext SGLang server: request %s: SGLang counted %s prompt tokens, %d were sent",
            request_id,
            report.prompt_tokens,
            prompt_len,
        )
    extra: dict[str, Any] = {"global_steps": global_steps, ENGINE_FIELD: {**report.to_dict(), **(stamps or {})}}
    if report.cached_tokens is not None:
        extra["num_cached_tokens"] = int(report.cached_tokens)
    return {
        "token_ids": ids,
        "log_probs": logprobs if wants_logprobs else None,
        "stop_reason": report.finish_type,
        "extra_fields": extra,
    }
