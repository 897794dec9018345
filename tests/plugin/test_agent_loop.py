"""verl_ext_tool_agent in process, against the CPU engine: multi-turn tool calls, repairs, budget, check verdicts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from loop_harness import run_loop

from verl_ext.plugin import metrics_sink

IM_END, NL = 151645, 198
PROMPT = [
    {"role": "system", "content": "Use the calculator tool."},
    {"role": "user", "content": "What is 12 * 7?"},
]


def tool_call(name: str = "calculator", arguments: str = '{"expression": "12 * 7"}') -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call><|im_end|>'


def test_tool_call_turn_then_answer_keeps_engine_tokens(make_loop, tmp_path):
    metrics_sink.drain()
    loop, server = make_loop(force_text=tool_call(), verl_ext={"records": {"dir": str(tmp_path)}})
    out = run_loop(loop, PROMPT, global_steps=3)

    first, second = server.requests[0], server.requests[1]
    assert first["sampling_params"]["max_tokens"] == 96  # the whole budget on the first turn
    tokenizer = loop.tokenizer
    forced = tokenizer.encode(tool_call(), add_special_tokens=False)
    stream = out.prompt_ids + out.response_ids
    assert stream[len(out.prompt_ids) : len(out.prompt_ids) + len(forced)] == forced  # sampled ids, as sampled
    assert stream[len(out.prompt_ids) + len(forced)] == NL  # the "\n" after <|im_end|>, restored ...
    assert out.response_mask[len(forced)] == 0  # ... and masked
    # the second prompt is the first + output + repair + tool turn; its budget is what is left
    assert second["prompt_ids"][: len(first["prompt_ids"]) + len(forced)] == first["prompt_ids"] + forced
    used = len(second["prompt_ids"]) - len(first["prompt_ids"])
    assert second["sampling_params"]["max_tokens"] == 96 - used
    assert "<tool_response>\n84\n</tool_response>" in tokenizer.decode(second["prompt_ids"])
    assert len(out.response_ids) <= 96 and sum(out.response_mask) == sum(len(r["output_ids"]) for r in server.requests)

    check = out.extra_fields["verl_ext_check"]
    assert check["engine_ok"] and check["ok"], check["summary"]
    m = metrics_sink.drain()
    assert m["tito/rollouts_checked"] == 1 and m["tito/engine_view_failures"] == 0
    assert m["tito/tool/calls"] == 1 and m["tito/tool/ok"] == 1 and m["tito/repairs/boundary"] >= 1

    record = [json.loads(line) for f in tmp_path.iterdir() for line in f.read_text().splitlines()]
    assert [r["type"] for r in record] == ["header", "rollout"]
    assert record[1]["step"] == 3 and record[1]["input_ids"] == stream


def test_tool_errors_become_tool_messages_and_metrics(make_loop):
    metrics_sink.drain()
    cases = {
        "unknown_tool": tool_call(name="abacus"),
        "malformed": '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+1"\n</tool_call><|im_end|>',
        "bad_arguments": tool_call(arguments='"1+1"'),
    }
    for status, text in cases.items():
        loop, server = make_loop(force_text=text)
        out = run_loop(loop, PROMPT)
        assert out.extra_fields["verl_ext_check"]["engine_ok"]
        m = metrics_sink.drain()
        assert m.get(f"tito/tool/{status}") == 1, (status, {k: v for k, v in m.items() if "tool" in k})
        assert "Error" in loop.tokenizer.decode(server.requests[1]["prompt_ids"])  # the model is told


def test_length_cut_turn_gets_a_synthetic_close_and_stays_in_budget(make_loop):
    metrics_sink.drain()
    loop, server = make_loop(force_text="The answer is " + "very " * 40, response_length=24)
    out = run_loop(loop, PROMPT)
    assert len(server.requests) == 1 and server.requests[0]["sampling_params"]["max_tokens"] == 24
    (request,) = server.requests
    assert len(request["output_ids"]) == 24 and sum(out.response_mask) == 24  # every sampled token is trained on
    check = out.extra_fields["verl_ext_check"]
    assert check["engine_ok"] and not check["truncated"]
    m = metrics_sink.drain()
    assert m["tito/lost_sampled_tokens"] == 0


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"chek": {"mode": "warn"}}, "verl_ext.chek"),
        ({"check": {"mode": "loud"}}, "mode"),
        ({"check": {"template_view_rate": 3}}, "template_view_rate"),
        ({"check": {"template_view_budget_s": 0}}, "template_view_budget_s"),
        ({"records": {"max_files": 0}}, "verl_ext.records.max_files"),
        ({"escape_special_tokens": "yes"}, "verl_ext.escape_special_tokens"),
    ],
)
def test_bad_options_stop_the_loop_naming_the_key(make_loop, options, named):
    from verl_ext.plugin.options import OptionsError

    with pytest.raises(OptionsError, match=re.escape(named)):
        make_loop(verl_ext=options)


def test_top_level_config_section_and_loop_kwargs_merge(make_loop):
    loop, _ = make_loop(
        extra=["+verl_ext.check.mode=strict", "+verl_ext.tool_timeout_s=5"], verl_ext={"tool_timeout_s": 2}
    )
    assert loop.options.check.mode.value == "strict" and loop.options.tool_timeout_s == 2.0


FAILING_TOOLS = Path(__file__).parent / "failing_tools.py"


@pytest.mark.parametrize(
    ("call", "status", "says"),
    [
        (tool_call("explode", '{"reason": "test"}'), "error", "RuntimeError: exploded: test"),
        (tool_call("sleepy", '{"seconds": 30}'), "timeout", "timed out after 0.2 s"),
    ],
)
def test_tool_exceptions_and_timeouts_become_tool_messages(make_loop, call, status, says):
    metrics_sink.drain()
    loop, server = make_loop(force_text=call, tools_path=FAILING_TOOLS, verl_ext={"tool_timeout_s": 0.2})
    out = run_loop(loop, PROMPT)
    assert out.extra_fields["verl_ext_check"]["engine_ok"]
    assert says in loop.tokenizer.decode(server.requests[1]["prompt_ids"])  # the model reads what went wrong
    m = metrics_sink.drain()
    assert m[f"tito/tool/{status}"] == 1 and m["tito/tool/calls"] == 1


def test_a_configured_stop_on_the_call_close_keeps_the_call(make_loop):
    # stopping on </tool_call> (an extra stop token) must not strip the tag the parser needs
    metrics_sink.drain()
    call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 7"}}\n</tool_call>'
    loop, server = make_loop(force_text=call, verl_ext={"extra_stop_tokens": ["</tool_call>"]})
    out = run_loop(loop, PROMPT, stop_token_ids=[151658])
    assert len(server.requests) == 2 and out.extra_fields["verl_ext_check"]["ok"]
    m = metrics_sink.drain()
    assert m["tito/tool/ok"] == 1 and m["tito/findings/synthetic_close"] >= 1


def test_per_sample_tool_selection_is_respected(make_loop):
    metrics_sink.drain()
    loop, server = make_loop(force_text=tool_call())
    run_loop(loop, PROMPT, extra_info={"tool_selection": ["abacus"]})  # calculator is not selected for this sample
    assert '"name": "calculator"' not in loop.tokenizer.decode(server.requests[0]["prompt_ids"])
    assert metrics_sink.drain()["tito/tool/unknown_tool"] == 1


def test_tool_responses_are_capped_like_verls_tool_agent(make_loop):
    extra = ["actor_rollout_ref.rollout.multi_turn.max_tool_response_length=3"]
    loop, server = make_loop(force_text=tool_call("sleepy", '{"seconds": 0}'), tools_path=FAILING_TOOLS, extra=extra)
    run_loop(loop, PROMPT)
    text = loop.tokenizer.decode(server.requests[1]["prompt_ids"])
    assert "a...(truncated)...e" in text and "awake" not in text  # verl's default side: the middle


def test_audit_of_the_stock_loop_at_its_turn_limit_reports_no_defect(make_loop):
    # verl's tool_agent returns before adding its last assistant message; the audit adds it back
    metrics_sink.drain()
    extra = ["actor_rollout_ref.rollout.multi_turn.max_assistant_turns=1"]
    loop, _ = make_loop(force_text=tool_call(), stock=True, extra=extra)
    out = run_loop(loop, PROMPT)
    causes = out.extra_fields["verl_ext_check"]["causes"]
    assert "unknown" not in causes, out.extra_fields["verl_ext_check"]["summary"]
    assert causes == {"stop_text_in_message": 1}  # verl's hermes parser puts "<|im_end|>" in the content


@pytest.mark.parametrize("stock", [False, True], ids=["verl_ext_tool_agent", "verl_ext_audited_tool_agent"])
def test_a_records_folder_the_node_cannot_create_is_counted_and_every_rollout_goes_on(make_loop, tmp_path, stock):
    # the folder's parent is a file: mkdir fails on this "node" as it does on a read-only or unmounted path
    (tmp_path / "not-a-folder").write_text("")
    records = tmp_path / "not-a-folder" / "records"
    metrics_sink.drain()
    loop, _ = make_loop(force_text=tool_call(), verl_ext={"records": {"dir": str(records)}}, stock=stock)
    for _ in range(2):
        out = run_loop(loop, PROMPT, global_steps=1)
        assert out.extra_fields["verl_ext_check"]["engine_ok"]
    m = metrics_sink.drain()
    assert m["tito/records/write_failures"] == 2 and m["tito/rollouts_checked"] == 2
