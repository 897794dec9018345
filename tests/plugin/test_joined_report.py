"""The engine report of a turn resumed across attempts (plugin/engine_turn.py): the joined output's report describes
the joined output (whole where its last attempt is), and each attempt's own report is kept in it.

The attempts are SGLang-shaped reports (engines/sglang_output.py's ``EngineReport`` fields plus the version stamps) as
verl_ext's SGLang server returns them for an abort and its resume; the engine is scripted, no model runs."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest

import verl_ext.plugin.engine_turn as engine_turn
from verl_ext.core.version_spans import DISPATCH_VERSION_FIELD, PROMPT_CRC_FIELD, STOP_VERSION_FIELD, engine_stamps
from verl_ext.engines.sglang_output import ENGINE_FIELD
from verl_ext.plugin.engine_turn import ATTEMPTS_KEY, generate_turn, joined_report

PROMPT = [1, 2, 3]


def _report(kind: str, ids: int, dispatched: int, stopped: int, prompt: list[int], cut: int = 0) -> dict[str, Any]:
    return {
        "finish_type": kind,
        "matched_stop_id": 7 if kind == "stop" else None,
        "finish_consistent": True,
        "prompt_tokens": len(prompt),
        "completion_tokens": ids + cut,
        "cached_tokens": 2,
        "weight_version": str(stopped),
        "returned_ids": ids + cut,
        "logprob_entries": ids,
        "kept_ids": ids,
        "ids_match_logprobs": not cut,
        "id_check_detail": "the last id has no logprob entry" if cut else "",
        "complete": kind != "abort" and not cut,
        **engine_stamps(dispatched, stopped, prompt),
    }


class Scripted:
    """A server manager whose calls return the scripted outputs in turn (``generate_attempt``: one engine call)."""

    def __init__(self, outputs: list[tuple[list[int], str, dict[str, Any]]]) -> None:
        self.outputs = list(outputs)

    async def generate_attempt(self, request_id: str, *, prompt_ids: list[int], sampling_params: Any, **_: Any):
        ids, reason, report = self.outputs.pop(0)
        fields = {"global_steps": int(report["weight_version"]), ENGINE_FIELD: report}
        return SimpleNamespace(token_ids=ids, log_probs=[-0.5] * len(ids), stop_reason=reason, extra_fields=fields)


def _turn(**kwargs: Any) -> Any:
    aborted = _report("abort", 3, 4, 4, PROMPT, cut=1)  # 3 ids kept, one cut by the id check
    whole = _report("stop", 5, 5, 5, [*PROMPT, 10, 11, 12])
    server = Scripted([([10, 11, 12], "abort", aborted), ([13, 14, 15, 16, 7], "completed", whole)])
    return asyncio.run(generate_turn(server, "r", PROMPT, {}, 40, Counter(), **kwargs)), aborted, whole


def test_the_joined_report_describes_the_joined_output_and_keeps_each_attempts() -> None:
    turn, aborted, whole = _turn()
    report = turn.extra_fields[ENGINE_FIELD]
    assert report["complete"] is True  # the last attempt completed: the joined output is whole
    assert (report["finish_type"], report["matched_stop_id"], report[STOP_VERSION_FIELD]) == ("stop", 7, 5)
    # sent with the turn's prompt on version 4 (the first attempt's), cached as that prefill was
    assert report[DISPATCH_VERSION_FIELD] == 4 and report[PROMPT_CRC_FIELD] == aborted[PROMPT_CRC_FIELD]
    assert (report["prompt_tokens"], report["cached_tokens"]) == (3, 2)
    assert (
        (report["returned_ids"], report["kept_ids"], report["logprob_entries"])
        == (9, 8, 8)
        == (9, len(turn.token_ids), 8)
    )
    assert report["ids_match_logprobs"] is False and report["id_check_detail"] == aborted["id_check_detail"]
    assert report[ATTEMPTS_KEY] == [aborted, whole]  # each attempt's own report, in order
    assert turn.extra_fields["global_steps"] == 4 and turn.extra_fields["max_global_steps"] == 5


def test_a_turn_whose_last_attempt_is_cut_short_is_not_complete() -> None:
    aborted = _report("abort", 3, 4, 4, PROMPT)
    joined = joined_report([aborted, aborted], complete=False)
    assert joined["complete"] is False and len(joined[ATTEMPTS_KEY]) == 2


def test_one_attempt_keeps_its_own_report() -> None:
    whole = _report("stop", 5, 5, 5, PROMPT)
    server = Scripted([([13, 14, 15, 16, 7], "completed", whole)])
    turn = asyncio.run(generate_turn(server, "r", PROMPT, {}, 40, Counter()))
    assert turn.extra_fields[ENGINE_FIELD] == whole


def test_without_resumes_an_aborted_attempt_is_the_turn() -> None:
    """``resume_aborts=False`` (verl's ``partial_rollout: false``): the aborted attempt is handed back, counted."""
    aborted = _report("abort", 3, 4, 4, PROMPT)
    server = Scripted([([10, 11, 12], "abort", aborted)])
    counters: Counter[str] = Counter()
    turn = asyncio.run(generate_turn(server, "r", PROMPT, {}, 40, counters, resume_aborts=False))
    assert (turn.token_ids, turn.stop_reason, len(turn.segments)) == ([10, 11, 12], "abort", 1)
    assert turn.extra_fields[ENGINE_FIELD]["complete"] is False
    assert counters["engine/aborted_turns_not_resumed"] == 1 and not server.outputs


def test_mutation_the_first_attempts_report_as_the_joined_one_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation: the joined output keeps the first attempt's report (as before): it reads incomplete and aborted."""
    monkeypatch.setattr(engine_turn, "joined_report", lambda reports, complete: dict(reports[0]))
    turn, _, _ = _turn()
    report = turn.extra_fields[ENGINE_FIELD]
    assert report["complete"] is False and report["finish_type"] == "abort" and ATTEMPTS_KEY not in report
