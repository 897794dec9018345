"""Policy versions through verl_ext_tool_agent's real loop, on the CPU engine: an engine that aborts a turn after
k tokens, takes a weight update and resumes it (stamping each attempt as a truthful engine does) gives a record whose
version spans are the truth, a check with no defect, and the step's tito/async/ metrics; the opt-in stale-token mask
masks exactly the old tokens; a version stamped on return is caught in its turn."""

from __future__ import annotations

from typing import Any

import pytest
from loop_harness import run_loop

from verl_ext.core.version_spans import VersionSpan, engine_stamps
from verl_ext.engines.sglang_output import ENGINE_FIELD
from verl_ext.plugin import metrics_sink
from verl_ext.telemetry.records import read_records

pytestmark = pytest.mark.xdist_group("ray")  # the Ray group: tests/conftest.py (the loop harness's CPU engine)

PROMPT = [{"role": "user", "content": "What is 12 * 7? Use the calculator."}]


class AbortingVersionedServer:
    """verl's server-manager interface over the CPU engine: the first ``aborts`` calls stop after ``keep`` ids with
    ``abort``, then the weights' version goes up by one (the update that aborted them) and the turn is resumed.
    Each attempt's report carries what a truthful engine stamps; ``truth`` keeps (version, ids) per attempt.
    ``stamp_on_return``: the dispatch version is read after the update, as verl's server reads global_steps."""

    def __init__(self, inner: Any, keep: int, aborts: int, version: int, stamp_on_return: bool = False) -> None:
        self.inner, self.keep, self.left, self.version = inner, keep, aborts, version
        self.stamp_on_return = stamp_on_return
        self.truth: list[tuple[int, int]] = []

    async def generate(self, request_id: str, *, prompt_ids: list[int], sampling_params: dict[str, Any], **kw: Any):
        dispatched = self.version
        abort = self.left > 0 and sampling_params["max_tokens"] > self.keep
        if abort:
            sampling_params = {**sampling_params, "max_tokens": self.keep}
        out = await self.inner.generate(request_id, prompt_ids=prompt_ids, sampling_params=sampling_params, **kw)
        stopped = self.version
        if abort and len(out.token_ids) == self.keep:
            self.left -= 1
            out.stop_reason = "abort"
            self.version += 1  # the weight update the abort was for, before the resume
        self.truth.append((dispatched, len(out.token_ids)))
        stamped = self.version if self.stamp_on_return else dispatched
        report = {**engine_stamps(stamped, stopped, prompt_ids), "weight_version": str(self.version)}
        out.extra_fields = {**out.extra_fields, "global_steps": self.version, ENGINE_FIELD: report}
        return out


def _run(make_loop, tmp_path, options: dict[str, Any] | None = None, **server: Any):
    loop, inner = make_loop(response_length=40, verl_ext={"records": {"dir": str(tmp_path)}, **(options or {})})
    loop.server_manager = AbortingVersionedServer(inner, **server)
    metrics_sink.drain()
    out = run_loop(loop, PROMPT, global_steps=8)
    _, (record,) = read_records(sorted(tmp_path.glob("*.jsonl")))
    return out, record, loop.server_manager, metrics_sink.drain()


def test_a_resumed_turns_version_spans_are_the_truth_and_it_checks_clean(make_loop, tmp_path) -> None:
    out, record, server, m = _run(make_loop, tmp_path, keep=3, aborts=2, version=5)
    truth = [v for v, n in server.truth for _ in range(n)]
    spans = [s for call in record.versions.spans() for s in call]
    assert [v for s in spans for v in [s.version] * s.tokens] == truth  # every output token, in call order
    assert record.versions.spans()[0][:2] == [VersionSpan(5, 0, 3), VersionSpan(6, 3, 6)]
    assert record.versions.trained_step == 8 == record.step and record.versions.served[0] == 7
    assert record.check.ok and out.extra_fields["verl_ext_check"]["engine_ok"], record.check
    assert m["tito/async/resumes"] == 2 and m["tito/async/mixed_turns"] >= 1
    assert m["tito/async/versioned_tokens"] == len(truth)
    assert m["tito/async/staleness_mean"] == pytest.approx(sum(8 - 1 - v for v in truth) / len(truth))
    assert m["tito/async/masked_stale_tokens"] == 0 and m["tito/findings/version_stamped_on_return"] == 0
    assert m["tito/async/unstamped_tokens"] == 0 and m["tito/async/unverified_resumes"] == 0


def test_the_stale_token_mask_masks_exactly_the_tokens_older_than_the_option(make_loop, tmp_path) -> None:
    out, record, server, m = _run(make_loop, tmp_path, {"max_token_lag": 1}, keep=3, aborts=2, version=5)
    start = record.prompt_length
    old = {
        call.prompt_length + i - start
        for call, spans in zip(record.engine_calls, record.versions.spans(), strict=True)
        for s in spans
        if 8 - 1 - s.version > 1
        for i in range(s.start, s.end)
    }
    assert old and all(out.response_mask[p] == 0 for p in old)
    sampled = [p for p, bit in enumerate(record.loss_mask[start:]) if bit]
    assert [p for p in sampled if out.response_mask[p] == 0] == sorted(old)  # nothing else is masked
    assert m["tito/async/masked_stale_tokens"] == len(old)
    assert record.check.ok  # the record keeps the sampled mask; the check judged that


def test_a_version_stamped_on_return_is_caught_in_its_turn(make_loop, tmp_path) -> None:
    _, record, _, m = _run(make_loop, tmp_path, keep=3, aborts=1, version=5, stamp_on_return=True)
    defects = [f for f in record.check.findings if f.cause == "version_stamped_on_return"]
    assert defects and {f.turn for f in defects} == {0}
    assert m["tito/findings/version_stamped_on_return"] == len(defects)


@pytest.mark.parametrize("bad", [-1, 1.5, "2", True])
def test_a_bad_max_token_lag_names_the_key_and_the_fix(bad: Any) -> None:
    from verl_ext.core.errors import OptionsError
    from verl_ext.plugin.options import LoopOptions

    assert LoopOptions.from_mapping({}).max_token_lag is None
    assert LoopOptions.from_mapping({"max_token_lag": 0}).max_token_lag == 0
    with pytest.raises(OptionsError, match=r"verl_ext\.max_token_lag must be a whole number.*e\.g\."):
        LoopOptions.from_mapping({"max_token_lag": bad})
