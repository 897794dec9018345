"""verl_ext's SGLang server's ``generate`` driven with SGLang 0.5.12's own request, finish and output code on CPU
(sglang_standin.py), and with recordings from a GPU run where tests/fixtures/sglang has them."""

from __future__ import annotations

import asyncio
import inspect
import os
from types import SimpleNamespace
from typing import Any

import pytest
from sglang_shim import load_sglang, sglang_installed
from sglang_standin import (
    RecordedTokenizerManager,
    Script,
    ScriptedTokenizerManager,
    input_logprob_at,
    load_recordings,
)

if not sglang_installed():
    if os.getenv("VERL_EXT_REQUIRE_SGLANG", "0") == "1":
        raise RuntimeError("sglang 0.5.12 is not installed; `make sglang-cpu` installs it (--no-deps, CPU only)")
    pytest.skip("sglang is not installed (make sglang-cpu)", allow_module_level=True)

IM_END, ENDOFTEXT, TOOL_CLOSE = 151645, 151643, 151658  # Qwen3's <|im_end|>, <|endoftext|>, </tool_call>
EOS = {IM_END, ENDOFTEXT}  # Qwen3's generation_config eos_token_id, which SGLang stops on
VOCAB = 151936
PROMPT = [151644, 872, 198, 14990, 151645, 198, 151644, 77091, 198]
PARAMS = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}


@pytest.fixture(scope="module")
def server_class() -> type:
    load_sglang()
    from verl_ext.engines.sglang_server import TokenExactSGLangServer

    return TokenExactSGLangServer


def make_server(server_class: type, tokenizer_manager: Any, global_steps: int = 3) -> Any:
    """The actor's object without Ray or an engine launch: generate only reads these attributes."""
    server = server_class.__new__(server_class)
    server.config = SimpleNamespace(
        response_length=64, prompt_length=64, max_model_len=4096, enable_rollout_routing_replay=False
    )
    server.global_steps = global_steps
    server.tokenizer_manager = tokenizer_manager
    server._disaggregation_role = None
    server.model_config = SimpleNamespace(lora_rank=0, lora={})  # no LoRA: verl's lora_as_adapter is False
    return server


def generate(server: Any, params: dict[str, Any], prompt: list[int] = PROMPT) -> Any:
    return asyncio.run(server.generate(prompt, dict(params), "req-1"))


def scripted(server_class: type, *scripts: Script) -> tuple[Any, ScriptedTokenizerManager]:
    tm = ScriptedTokenizerManager(EOS, VOCAB, list(scripts), weight_version="7")
    return make_server(server_class, tm), tm


def engine(out: Any) -> dict[str, Any]:
    return out.extra_fields["verl_ext_engine"]


def test_normal_stop_keeps_the_stop_token_and_reports_the_match(server_class: type) -> None:
    script = Script([10, 11, IM_END, 99], logprobs=[-0.1, -0.2, -0.3, -0.4], cached_tokens=4)
    server, tm = scripted(server_class, script)
    out = generate(server, {**PARAMS, "max_tokens": 8})
    assert out.token_ids == [10, 11, IM_END]
    assert out.log_probs == [-0.1, -0.2, -0.3]
    assert out.stop_reason == "stop"
    e = engine(out)
    assert (e["matched_stop_id"], e["finish_consistent"], e["complete"]) == (IM_END, True, True)
    assert (e["prompt_tokens"], e["completion_tokens"], e["cached_tokens"]) == (len(PROMPT), 3, 4)
    assert e["weight_version"] == "7" and out.extra_fields["global_steps"] == 3
    assert out.extra_fields["num_cached_tokens"] == 4
    sent = tm.requests[0]
    assert sent.input_ids == PROMPT and sent.return_logprob is True
    assert sent.sampling_params["max_new_tokens"] == 8
    assert "max_tokens" not in sent.sampling_params and "logprobs" not in sent.sampling_params


def test_user_stop_id_is_kept_and_matched(server_class: type) -> None:
    server, _ = scripted(server_class, Script([10, TOOL_CLOSE, 12]))
    out = generate(server, {**PARAMS, "max_tokens": 8, "stop_token_ids": [TOOL_CLOSE]})
    assert out.token_ids == [10, TOOL_CLOSE]
    assert engine(out)["matched_stop_id"] == TOOL_CLOSE and out.stop_reason == "stop"


def test_length_finish(server_class: type) -> None:
    server, _ = scripted(server_class, Script([10, 11, 12, 13]))
    out = generate(server, {**PARAMS, "max_tokens": 3})
    assert out.token_ids == [10, 11, 12] and out.stop_reason == "length"
    e = engine(out)
    assert (e["finish_length"], e["matched_stop_id"], e["finish_consistent"], e["complete"]) == (3, None, True, True)


def test_eos_as_last_token_of_a_length_finish(server_class: type) -> None:
    """SGLang 0.5.12 checks the length before the stop ids: the EOS stays in the ids under a 'length' label."""
    server, _ = scripted(server_class, Script([10, 11, IM_END]))
    out = generate(server, {**PARAMS, "max_tokens": 3})
    assert out.token_ids == [10, 11, IM_END]
    assert out.stop_reason == "length" and engine(out)["finish_consistent"] is True


def test_eos_alias_stops_and_is_kept(server_class: type) -> None:
    server, _ = scripted(server_class, Script([10, ENDOFTEXT, 11]))
    out = generate(server, {**PARAMS, "max_tokens": 8})
    assert out.token_ids == [10, ENDOFTEXT] and engine(out)["matched_stop_id"] == ENDOFTEXT


def test_abort_keeps_the_partial_output_marked_incomplete(server_class: type) -> None:
    server, _ = scripted(server_class, Script([10, 11, 12, IM_END], abort_after=2))
    out = generate(server, {**PARAMS, "max_tokens": 8})
    assert out.token_ids == [10, 11] and len(out.log_probs) == 2
    assert out.stop_reason == "abort"
    e = engine(out)
    assert e["complete"] is False and e["finish_message"] == "Aborted" and e["ids_match_logprobs"] is True


def test_empty_output_of_an_immediate_abort(server_class: type) -> None:
    server, _ = scripted(server_class, Script([10, 11], abort_after=0))
    out = generate(server, {**PARAMS, "max_tokens": 8})
    assert out.token_ids == [] and out.log_probs == [] and out.stop_reason == "abort"
    assert engine(out)["complete"] is False


@pytest.mark.parametrize(
    ("corruption", "kept"),
    [({"wrong_logprob_id_at": 1}, 1), ({"drop_logprob_entries": 1}, 2)],
    ids=["entry-id-differs", "entry-missing"],
)
def test_logprob_id_mismatch_keeps_the_covered_prefix(server_class: type, corruption: dict, kept: int) -> None:
    """verl's server returns [] on a count mismatch and never compares ids; ours keeps what the logprobs cover."""
    server, _ = scripted(server_class, Script([10, 11, IM_END], **corruption))
    out = generate(server, {**PARAMS, "max_tokens": 8})
    assert out.token_ids == [10, 11, IM_END][:kept] and len(out.log_probs) == kept
    e = engine(out)
    assert e["ids_match_logprobs"] is False and e["complete"] is False
    assert e["returned_ids"] == 3 and e["kept_ids"] == kept and e["id_check_detail"]


def test_logprobs_returned_only_when_asked_but_always_requested(server_class: type) -> None:
    server, tm = scripted(server_class, Script([10, IM_END]))
    out = generate(server, {**PARAMS, "logprobs": False, "max_tokens": 4})
    assert out.token_ids == [10, IM_END] and out.log_probs is None
    assert tm.requests[0].return_logprob is True and engine(out)["ids_match_logprobs"] is True


@pytest.mark.parametrize("key", ["stop", "stop_regex"])
def test_stop_strings_are_rejected_before_reaching_sglang(server_class: type, key: str) -> None:
    from verl_ext.engines.sglang_output import StopStringError

    server, tm = scripted(server_class)
    with pytest.raises(StopStringError, match="stop_token_ids"):
        generate(server, {**PARAMS, key: ["</tool_call>"]})
    assert tm.requests == []


def test_unknown_sampling_keys_fail_in_sglang(server_class: type) -> None:
    """SGLang's own SamplingParams refuses keys it does not know (verl strips vLLM-only ones; so does ours)."""
    server, _ = scripted(server_class, Script([10, IM_END]))
    with pytest.raises(TypeError):
        generate(server, {**PARAMS, "max_tokens": 4, "best_of": 2})


def test_budget_defaults_and_context_clamp(server_class: type) -> None:
    server, tm = scripted(server_class, Script([10, IM_END]), Script([10, IM_END]))
    generate(server, dict(PARAMS))  # no max_tokens: verl's default budget
    assert tm.requests[0].sampling_params["max_new_tokens"] == 64
    server.config.max_model_len = len(PROMPT) + 5
    generate(server, {**PARAMS, "max_tokens": 50})  # clamped to the context left
    assert tm.requests[1].sampling_params["max_new_tokens"] == 4


def test_only_generate_and_the_abort_signature_are_overridden(server_class: type) -> None:
    """Weight sync, sleep/wake, launch, resume: verl's own methods, untouched."""
    own = {name for name, _ in inspect.getmembers(server_class, inspect.isfunction) if name in vars(server_class)}
    assert own == {"generate", "abort_all_requests", "score"}  # score: the re-feed audit's path, verl has none
    params = inspect.signature(server_class.abort_all_requests).parameters
    assert "reject_request" in params


def test_abort_all_requests_accepts_verls_replica_call(server_class: type) -> None:
    """verl 0.9.1's RolloutReplica.abort_all_requests passes reject_request=..., which its SGLang server rejects."""
    calls: list[Any] = []

    class TM:
        async def pause_generation(self, obj: Any) -> None:
            calls.append(obj.mode)

    server = make_server(server_class, TM())
    server.node_rank = 0
    asyncio.run(server.abort_all_requests(reject_request=False))
    assert calls == ["abort"]


@pytest.mark.parametrize("recording", load_recordings(), ids=lambda r: r.get("case", "?"))
def test_recorded_sglang_outputs(server_class: type, recording: dict[str, Any]) -> None:
    """Real SGLang outputs from a GPU run: the server keeps their ids, and its checks hold on them."""
    sent = recording["request"]
    params = {**dict(sent.get("sampling_params") or {}), "logprobs": True}
    params["max_tokens"] = params.pop("max_new_tokens")
    server = make_server(server_class, RecordedTokenizerManager([recording]))
    out = asyncio.run(server.generate(list(sent["input_ids"]), params, sent.get("rid", "rec")))
    response = recording["response"]
    e = engine(out)
    assert e["ids_match_logprobs"], e["id_check_detail"]
    assert out.token_ids == list(response["output_ids"])
    assert e["finish_consistent"], e["finish_detail"]
    assert out.stop_reason == response["meta_info"]["finish_reason"]["type"]


def test_plugin_registers_the_replica_for_rollout_sglang(server_class: type) -> None:
    import verl  # noqa: F401 - loads the plugin through verl's entry point
    from verl.workers.rollout.replica import RolloutReplicaRegistry

    from verl_ext.engines.sglang_server import TokenExactSGLangReplica
    from verl_ext.plugin.loop_routing import server_enabled

    assert RolloutReplicaRegistry.get("sglang") is TokenExactSGLangReplica
    assert TokenExactSGLangReplica.server_switch is server_enabled  # the plugin's loop rule, set as it registers


def test_the_server_switch_follows_the_loop_routing_rule(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """One rule for both: a subclass of verl_ext's loop gets the token-exact server, a misspelled name an error."""
    from verl_ext.engines.sglang_output import SWITCH_ENV
    from verl_ext.plugin.loop_routing import UnknownLoopError, server_enabled

    monkeypatch.delenv(SWITCH_ENV, raising=False)
    loops = tmp_path / "loops.yaml"
    loops.write_text(
        "- name: my_exact\n  _target_: vx_user_loops.MyExactLoop\n"
        "- name: my_audited\n  _target_: vx_user_loops.MyAudited\n"
    )
    (tmp_path / "vx_user_loops.py").write_text(
        "from verl_ext.plugin.agent_loop import VerlExtToolAgentLoop\n"
        "from verl_ext.plugin.audit_loop import AuditedToolAgentLoop\n"
        "class MyExactLoop(VerlExtToolAgentLoop): pass\n"
        "class MyAudited(AuditedToolAgentLoop): pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    def agent(loop: str) -> dict[str, Any]:
        return {"agent": {"default_agent_loop": loop, "agent_loop_config_path": str(loops)}}

    assert server_enabled(agent("my_exact")) is True
    assert server_enabled(agent("my_audited")) is False
    with pytest.raises(UnknownLoopError, match=r"verl_ext_tool_agnet is not a registered agent loop \(did you mean "):
        server_enabled(agent("verl_ext_tool_agnet"))  # used to start with "verl_ext_": the server went on


@pytest.mark.parametrize(
    ("loop", "forced", "on"),
    [
        ("verl_ext_tool_agent", None, True),
        ("verl_ext_audited_tool_agent", None, False),  # the audit runs verl's own server, as it is
        ("tool_agent", None, False),
        ("tool_agent", "1", True),
        ("verl_ext_tool_agent", "0", False),
    ],
)
def test_the_loop_setting_switches_the_server(
    monkeypatch: pytest.MonkeyPatch, loop: str, forced: Any, on: bool
) -> None:
    from verl_ext.engines.sglang_output import SWITCH_ENV
    from verl_ext.plugin.loop_routing import server_enabled

    if forced is None:
        monkeypatch.delenv(SWITCH_ENV, raising=False)
    else:
        monkeypatch.setenv(SWITCH_ENV, forced)
    assert server_enabled({"agent": {"default_agent_loop": loop}}) is on


# The TEST/DEMO forced first turn (verl_ext/engines/forced_turn.py), as tests/gpu/run_sglang_grpo.py uses it on a GPU.


@pytest.fixture()
def forced_env(monkeypatch: pytest.MonkeyPatch) -> str:
    from verl_ext.engines.forced_turn import FORCED_TOOL_CALL, SGLANG_FORCE_ENV

    monkeypatch.setenv(SGLANG_FORCE_ENV, FORCED_TOOL_CALL)
    return FORCED_TOOL_CALL


def forced_server(name: str, load_tokenizer: Any, *scripts: Script) -> tuple[Any, ScriptedTokenizerManager]:
    load_sglang()
    from verl_ext.engines import sglang_server

    server, tm = scripted(getattr(sglang_server, name), *scripts)
    server.model_config.tokenizer = load_tokenizer("qwen3")
    server.config.mtp = None
    server.replica_rank = 0  # verl's own generate (later turns of the stock arm) traces under it
    return server, tm


@pytest.mark.parametrize("name", ["ForcedFirstTurnTokenExactSGLangServer", "ForcedFirstTurnStockSGLangServer"])
def test_forced_first_turn_is_scored_by_sglang(name: str, forced_env: str, load_tokenizer: Any) -> None:
    """The first turn is the forced text with SGLang's input logprobs of those ids (SGLang's own shift of them);
    the request is a scoring request, not a generation."""
    server, tm = forced_server(name, load_tokenizer, Script([5]))
    force_ids = load_tokenizer("qwen3").encode(forced_env, add_special_tokens=False)
    out = generate(server, {**PARAMS, "max_tokens": 64})
    assert out.token_ids == force_ids and force_ids[-1] == IM_END
    assert out.log_probs == [input_logprob_at(len(PROMPT) + i) for i in range(len(force_ids))]
    assert out.stop_reason == "stop" and out.extra_fields["global_steps"] == 3
    sent = tm.requests[0]
    assert list(sent.input_ids) == PROMPT + force_ids
    assert sent.logprob_start_len == len(PROMPT) - 1 and sent.return_logprob is True
    if name == "ForcedFirstTurnTokenExactSGLangServer":  # the forced output passes verl_ext's own checks
        e = engine(out)
        assert (e["matched_stop_id"], e["finish_consistent"], e["complete"]) == (IM_END, True, True)
        assert (e["prompt_tokens"], e["completion_tokens"]) == (len(PROMPT), len(force_ids))


@pytest.mark.parametrize("name", ["ForcedFirstTurnTokenExactSGLangServer", "ForcedFirstTurnStockSGLangServer"])
def test_later_turns_are_sampled(name: str, forced_env: str, load_tokenizer: Any) -> None:
    force_ids = load_tokenizer("qwen3").encode(forced_env, add_special_tokens=False)
    server, tm = forced_server(name, load_tokenizer, Script([10, 11, IM_END]))
    later = PROMPT + force_ids + [198, 151644, 872, 198]  # the forced turn, then a tool result
    out = asyncio.run(server.generate(later, {**PARAMS, "max_tokens": 8}, "req-2"))
    assert out.token_ids == [10, 11, IM_END] and out.log_probs == pytest.approx([-0.5, -0.51, -0.52])
    assert list(tm.requests[0].input_ids) == later


def test_forced_turn_cut_by_the_budget_is_a_length_finish(forced_env: str, load_tokenizer: Any) -> None:
    server, _ = forced_server("ForcedFirstTurnTokenExactSGLangServer", load_tokenizer, Script([5]))
    out = generate(server, {**PARAMS, "max_tokens": 3})
    assert len(out.token_ids) == 3 and out.stop_reason == "length"
    assert engine(out)["finish_consistent"] is True and engine(out)["finish_length"] == 3


@pytest.mark.parametrize(
    ("switch", "forced", "expected"),
    [
        ("1", True, "ForcedFirstTurnTokenExactSGLangServer"),
        ("0", True, "ForcedFirstTurnStockSGLangServer"),
        ("1", False, "TokenExactSGLangServer"),
        ("0", False, None),
    ],
)
def test_replica_server_class_follows_the_switch_and_the_hook(
    monkeypatch: pytest.MonkeyPatch, server_class: type, switch: str, forced: bool, expected: str | None
) -> None:
    from verl_ext.engines.forced_turn import FORCED_TOOL_CALL, SGLANG_FORCE_ENV
    from verl_ext.engines.sglang_output import SWITCH_ENV
    from verl_ext.engines.sglang_server import server_class_for
    from verl_ext.plugin.loop_routing import server_enabled

    monkeypatch.setenv(SWITCH_ENV, switch)
    if forced:
        monkeypatch.setenv(SGLANG_FORCE_ENV, FORCED_TOOL_CALL)
    else:
        monkeypatch.delenv(SGLANG_FORCE_ENV, raising=False)
    chosen = server_class_for(server_enabled({"agent": {"default_agent_loop": "tool_agent"}}))
    assert (chosen.__name__ if chosen else None) == expected


# The re-feed audit's scoring path (sglang_scoring.py): a prefill with input logprobs through SGLang's own request,
# proven on a canary (engines/scoring_canary.py) before any score is used.


def honest_script(prompt: list[int], n: int) -> Script:
    """A generation whose logprobs are what the stand-in's prefill scores those positions: an engine whose scoring
    path tells the truth."""
    return Script([1000 + i for i in range(n)], logprobs=[input_logprob_at(len(prompt) + i) for i in range(n)])


def canary(server: Any, tolerance: float = 1e-6) -> Any:
    from verl_ext.engines.scoring_canary import prove_scoring_path

    async def generate(prompt: list[int], params: dict[str, Any]) -> Any:
        return await server.generate(prompt, params, "canary")

    return asyncio.run(prove_scoring_path("sglang", generate, server.score, PROMPT, tolerance=tolerance, max_tokens=6))


def test_score_sends_a_prefill_with_input_logprobs_and_reads_the_ids_back(server_class: type) -> None:
    server, tm = scripted(server_class, Script([5]))
    ids = [*PROMPT, 1000, 1001, 1002]
    scored = asyncio.run(server.score(ids, len(PROMPT)))
    assert scored["ids"] == [1000, 1001, 1002] and scored["global_steps"] == 3 and scored["weight_version"] == "7"
    assert scored["logprobs"] == [input_logprob_at(len(PROMPT) + i) for i in range(3)]
    sent = tm.requests[0]
    assert list(sent.input_ids) == ids and sent.return_logprob is True
    assert sent.logprob_start_len == len(PROMPT) - 1 and sent.sampling_params["max_new_tokens"] == 1
    from verl_ext.core.errors import EngineRequestError

    with pytest.raises(EngineRequestError, match="temperature 1"):
        asyncio.run(server.score(ids, len(PROMPT), 0.7))


def test_the_canary_accepts_an_honest_sglang_scoring_path(server_class: type) -> None:
    server, _ = scripted(server_class, honest_script(PROMPT, 6), Script([5]))
    verdict = canary(server)
    assert verdict.accepted and verdict.tokens == 6 and verdict.max_abs_delta == 0.0, verdict.reason


@pytest.mark.parametrize(
    ("lie", "reason"),
    [
        (lambda p: input_logprob_at(p) - 20.0, "differ from generation by up to 20 nats"),  # sparkinfer #1001
        (lambda p: input_logprob_at(p + 1), "differ from generation"),  # each score one position off
        (lambda p: input_logprob_at(p) - (0.5 if p > len(PROMPT) + 3 else 0.0), "canary position 4"),
    ],
    ids=["shifted", "off-by-one", "shifted-past-a-depth"],
)
def test_the_canary_refuses_an_sglang_engine_whose_scores_lie(
    server_class: type, monkeypatch: pytest.MonkeyPatch, lie: Any, reason: str
) -> None:
    import sglang_standin

    server, _ = scripted(server_class, honest_script(PROMPT, 6), Script([5]))
    monkeypatch.setattr(sglang_standin, "input_logprob_at", lie)  # the engine's prefill scores, not its generation
    verdict = canary(server)
    assert not verdict.accepted and reason in verdict.reason, verdict
    assert verdict.reason.startswith("re-feed audit: the scoring path of sglang is refused")


class _UpdateDuringRequest:
    """The stand-in's tokenizer manager with a weight update landing during the first request: verl's pause aborts
    it (``abort_all_requests`` on the server, as verl's replica calls it), and the sync is done and the new
    ``global_steps`` set before the server reads the output back (the worst order for a stamp read on return)."""

    def __init__(self, inner: ScriptedTokenizerManager, server: Any, new_version: int) -> None:
        self.inner, self.server, self.new_version, self.updated = inner, server, new_version, False

    def generate_request(self, obj: Any, request: Any = None) -> Any:
        return self._generate(obj)

    async def _generate(self, obj: Any) -> Any:
        async for out in self.inner.generate_request(obj):
            if not self.updated:
                self.updated = True
                await self.server.abort_all_requests()
                self.server.global_steps = self.new_version
            yield out

    async def pause_generation(self, obj: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _resumed_turn(server_class: type) -> tuple[Any, Any]:
    """A turn aborted after 2 ids by a weight update (version 3 -> 4) and resumed: its engine call and versions, as
    verl_ext's loops record them from the server's reports (``segment``, ``Attempt.of``)."""
    from verl_ext.check.inputs import EngineCall
    from verl_ext.core.version_spans import Attempt, RolloutVersions, segment

    tm = ScriptedTokenizerManager(EOS, VOCAB, [Script([10, 11, 12], abort_after=2), Script([12, 13, IM_END])])
    server = make_server(server_class, tm, global_steps=3)
    server.node_rank = 0
    server.tokenizer_manager = _UpdateDuringRequest(tm, server, new_version=4)
    first = generate(server, {**PARAMS, "max_tokens": 8})
    second = generate(server, {**PARAMS, "max_tokens": 6}, prompt=PROMPT + list(first.token_ids))
    segs, ids, lps = [], [], []
    for out in (first, second):
        segs.append(
            segment(len(ids), out.token_ids, out.stop_reason, False, engine(out), out.extra_fields, out.log_probs)
        )
        ids, lps = ids + list(out.token_ids), lps + list(out.log_probs)
    call = EngineCall.of(PROMPT, ids, lps)
    return call, RolloutVersions(((Attempt.of(segs[0]), Attempt.of(segs[1])),), trained_step=5)


def test_versions_are_stamped_at_dispatch_and_an_abort_stops_on_the_version_it_replaced(server_class: type) -> None:
    """SGLang's own request path, a weight update aborting the first attempt: the attempts are sent on 3 and 4, the
    first stops on 3 (the abort's), the prompt CRCs are reported, and the version view finds nothing."""
    from verl_ext.check.version_view import version_findings

    call, versions = _resumed_turn(server_class)
    (attempts,) = versions.calls
    assert [(a.version, a.version_at_stop, a.start, a.end) for a in attempts] == [(3, 3, 0, 2), (4, 4, 2, 5)]
    findings, counts = version_findings([call], versions, lambda cause: False)
    assert findings == [] and counts.resumes == 1
    assert counts.unstamped_attempts == 0 and counts.unverified_resumes == 0


def test_mutation_a_version_read_on_return_is_caught_by_the_version_view(
    server_class: type, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutation: the dispatch version read when the output returns (verl's server's ``global_steps``): the aborted
    attempt claims the new weights, later than the version it stopped on: ``version_stamped_on_return``."""
    from verl_ext.check.findings import Cause
    from verl_ext.check.version_view import version_findings
    from verl_ext.engines import sglang_server

    stamps = sglang_server._VersionStamps._stamps

    def on_return(self: Any, dispatched: Any, aborts: int, stop_reason: Any, prompt_ids: list[int]) -> Any:
        return stamps(self, self.global_steps, aborts, stop_reason, prompt_ids)

    monkeypatch.setattr(sglang_server._VersionStamps, "_stamps", on_return)
    call, versions = _resumed_turn(server_class)
    findings, _ = version_findings([call], versions, lambda cause: False)
    assert [f.cause for f in findings] == [Cause.VERSION_STAMPED_ON_RETURN], findings
