"""verl's stock tool_agent vs verl_ext_tool_agent on the same engine and data, both watched by the check.

The stock loop's divergences are found and named (a turn that stopped on </tool_call> or <|endoftext|> has no
close; a turn given more than the remaining budget loses sampled tokens to the trainer's cut); ours has none.
"""

from __future__ import annotations

import json

import pytest
from loop_harness import run_loop

from verl_ext.plugin import metrics_sink

PROMPT = [
    {"role": "system", "content": "Use the calculator tool."},
    {"role": "user", "content": "What is 12 * 7?"},
]
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call>'
TOOL_CALL_END = 151658  # </tool_call>

SCENARIOS = {
    # the engine is configured to stop on </tool_call>: the turn has no <|im_end|>
    "stop_on_tool_call_end": dict(force_text=CALL, stop_token_ids=[TOOL_CALL_END]),
    # the model ends the tool-call turn with <|endoftext|>, an eos alias the template never renders
    "stop_on_endoftext": dict(force_text=CALL + "<|endoftext|>"),
}


def audit(make_loop, stock: bool, force_text: str, stop_token_ids=(), response_length: int = 96):
    metrics_sink.drain()
    loop, server = make_loop(force_text=force_text, response_length=response_length, stock=stock)
    out = run_loop(loop, PROMPT, stop_token_ids=stop_token_ids)
    return out.extra_fields["verl_ext_check"], metrics_sink.drain(), server


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_stock_loop_divergence_is_found_and_ours_has_none(make_loop, scenario):
    stock, stock_metrics, _ = audit(make_loop, True, **SCENARIOS[scenario])
    assert stock["engine_ok"]  # the stock loop trains on the engine's tokens here ...
    assert not stock["ok"] and stock["causes"].get("close_missing") == 1, stock  # ... but with no turn close
    assert stock_metrics["tito/findings/close_missing"] == 1 and stock_metrics["tito/defect_rate"] == 1.0

    ours, our_metrics, _ = audit(make_loop, False, **SCENARIOS[scenario])
    assert ours["ok"], ours["summary"]
    assert our_metrics["tito/findings/synthetic_close"] >= 1 and our_metrics["tito/defect_rate"] == 0.0


def test_stock_loop_budget_loses_sampled_tokens_and_ours_does_not(make_loop):
    # The second turn: the stock loop lets the engine use its default max_tokens (the whole response length);
    # the trainer then cuts the response at response_length and the excess sampled tokens are lost.
    stock, stock_metrics, stock_server = audit(make_loop, True, CALL + "<|im_end|>", response_length=64)
    assert stock["truncated"] and stock["lost_sampled_tokens"] > 0, stock
    assert stock_metrics["tito/lost_sampled_tokens"] == stock["lost_sampled_tokens"]

    ours, our_metrics, our_server = audit(make_loop, False, CALL + "<|im_end|>", response_length=64)
    assert not ours["truncated"] and our_metrics["tito/lost_sampled_tokens"] == 0
    used = len(our_server.requests[1]["prompt_ids"]) - len(our_server.requests[0]["prompt_ids"])
    assert our_server.requests[1]["sampling_params"]["max_tokens"] == 64 - used


def test_audit_explains_what_the_stock_loop_does_to_its_messages(make_loop, tmp_path):
    # verl's hermes parser decodes the stop token into the assistant's content; the re-render then differs
    metrics_sink.drain()
    loop, server = make_loop(force_text=CALL + "<|im_end|>", stock=True, verl_ext={"records": {"dir": str(tmp_path)}})
    seen = []
    conclude = loop.rt.conclude
    loop.rt.conclude = lambda rollout, counters: seen.append(rollout) or conclude(rollout, counters)
    run_loop(loop, PROMPT)
    records = [json.loads(line) for f in tmp_path.iterdir() for line in f.read_text().splitlines()]
    details = [f["detail"] for r in records if r["type"] == "rollout" for f in r["check"]["findings"]]
    assert any("holds the stop token text '<|im_end|>'" in d for d in details), details

    # The audit recorded each stock engine call as it happened: equal to what the engine was sent and returned,
    # each keeping only the ids its prompt adds to the previous call's prompt + output (O(stream) for a long rollout,
    # not O(turns x stream)).
    calls = seen[0].calls
    assert len(calls) == len(server.requests) == 2  # the forced tool call, then the tiny model writes no call
    assert [c.prompt_ids for c in calls] == [tuple(r["prompt_ids"]) for r in server.requests]
    assert [list(c.output_ids) for c in calls] == [r["output_ids"] for r in server.requests]
    assert calls[0].shared == 0 and calls[1].shared == calls[0].output_end
    assert len(calls[1].tail) == calls[1].prompt_length - calls[0].output_end
