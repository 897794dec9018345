"""A real NaN forward pass in the CPU engine: the step goes on, nothing invalid is trained, the failure is named."""

from __future__ import annotations

import math

import pytest
import torch

from verl_ext.plugin import metrics_sink

PROMPT = [{"role": "user", "content": "What is 12 * 7?"}]
GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


@pytest.mark.parametrize("stock", [False, True], ids=["verl_ext_tool_agent", "audited_stock_tool_agent"])
def test_a_nan_model_is_a_named_failure_not_a_crash(make_loop, stock):
    metrics_sink.drain()
    loop, server = make_loop(response_length=16, stock=stock)
    with torch.no_grad():
        server.server.model.model.norm.weight.fill_(float("nan"))  # every logit NaN, as a diverged model gives
    out = loop.loop.run_until_complete(loop.run(dict(GREEDY), raw_prompt=PROMPT))

    check = out.extra_fields["verl_ext_check"]
    assert not check["engine_ok"] and "ENGINE VIEW FAILED" in check["summary"]
    m = metrics_sink.drain()
    assert m["tito/engine_view/logprob_not_finite"] == 1
    if not stock:
        # verl_ext's loop: the turn is cut at its first NaN, so nothing of it is trained, and the rollout ends there
        assert len(server.requests) == 1 and not any(out.response_mask)
        assert all(math.isfinite(x) for x in out.response_logprobs)
        assert m["tito/rollouts_ended_on_invalid_output"] == 1
        assert m["tito/engine_view_failures"] == 1  # the named one only: no stream or mask failure besides
