"""The gateway on a running SGLang server (``--sglang-url``): its native ``/generate`` served by SGLang 0.5.12's own
HTTP app on CPU (sglang_http_standin.py), with scripted ids through SGLang's finish and output code, or with an
output recorded on a GPU (tests/fixtures/sglang); driven by the official OpenAI SDK."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from gateway_fixtures import CALL, TOOLS
from sdk_harness import react_calculator
from sglang_http_standin import (
    RecordedTokenizerManager,
    Script,
    ScriptedTokenizerManager,
    load_recordings,
    load_sglang,
    sglang_installed,
    sglang_server,
)

from verl_ext.core.errors import EngineRequestError
from verl_ext.gateway.server import ServerThread, create_app
from verl_ext.gateway.sglang_engine import SGLangEngine
from verl_ext.telemetry.records import read_records

if not sglang_installed():
    if os.getenv("VERL_EXT_REQUIRE_SGLANG", "0") == "1":
        raise RuntimeError("sglang 0.5.12 is not installed; `make sglang-cpu` installs it (--no-deps, CPU only)")
    pytest.skip("sglang is not installed (make sglang-cpu)", allow_module_level=True)

EOS = {151645, 151643}  # Qwen3's <|im_end|>, <|endoftext|>: SGLang stops on the model's eos ids itself
VOCAB = 151936
ANSWER = "<think>\nThe tool said %s.\n</think>\n\nThe answer is %s.<|im_end|>"


@pytest.fixture(scope="module", autouse=True)
def sglang_loaded() -> None:
    load_sglang()


def scripted(tokenizer: Any, text: str, first_logprob: float = -0.25, **kw: Any) -> Script:
    ids = tokenizer.encode(text, add_special_tokens=False)
    return Script(ids, logprobs=[first_logprob - 0.01 * i for i in range(len(ids))], **kw)


def gateway_on(url: str, parts: dict[str, Any], records: Path) -> Any:
    from verl_ext.gateway.service import Gateway
    from verl_ext.runtime import RolloutRuntime
    from verl_ext.telemetry.records import RecordWriter, header_record

    writer = RecordWriter(records, header_record(parts["profile"]), prefix="gateway")
    engine = SGLangEngine(url, max_context=4096)
    runtime = RolloutRuntime.build(parts["renderer"]).with_writer(writer)
    return Gateway(engine, runtime, parts["reader"], markers=parts["markers"])


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_react_session_on_sglang_keeps_its_ids_and_logprobs(
    gateway_parts: Any, tiny_qwen3_dir: Path, tmp_path: Path
) -> None:
    from verl_ext.gateway.local import local_gateway
    from verl_ext.gateway.sglang_engine import model_context

    tokenizer = gateway_parts["tokenizer"]
    scripts = [scripted(tokenizer, CALL % "6*7", -0.5), scripted(tokenizer, ANSWER % (42, 42), -0.75)]
    tm = ScriptedTokenizerManager(EOS, VOCAB, list(scripts), weight_version="3")
    with sglang_server(tm) as sglang:
        # as `verl-ext gateway --model DIR --sglang-url URL` builds it: DIR's tokenizer and limits, SGLang's samples
        engine = SGLangEngine(sglang.url, max_context=model_context(str(tiny_qwen3_dir)))
        gateway = local_gateway(tiny_qwen3_dir, records_dir=tmp_path / "records", engine=engine)
        assert engine.max_context == 2048 and gateway.engine is engine
        server = ServerThread(create_app(gateway, "policy")).start()
        try:
            sdk = openai.OpenAI(base_url=f"{server.url}/sessions/r/v1", api_key="k", max_retries=0)
            out = react_calculator(sdk, "What is 6*7?", TOOLS)
        finally:
            server.stop()
    assert out["answer"] == "The answer is 42."
    (result,) = gateway.end("r")
    assert result.result.ok and result.result.engine_ok and gateway.counters["forks"] == 0
    _, (record,) = read_records(sorted((tmp_path / "records").glob("*.jsonl")))
    assert [list(c.output_ids) for c in record.engine_calls] == [list(s.ids) for s in scripts]
    assert [list(c.logprobs or ()) for c in record.engine_calls] == [list(s.logprobs or ()) for s in scripts]
    # what SGLang received: the session's ids as the prompt, logprobs asked for, the budget and the parser's stops
    assert len(tm.requests) == 2
    for sent, call in zip(tm.requests, record.engine_calls, strict=True):
        assert list(sent.input_ids) == list(record.input_ids[: call.prompt_length])
        assert sent.return_logprob is True and sent.sampling_params["max_new_tokens"] == 64
        assert sent.rid.startswith("verl-ext-gateway-")


def test_the_request_is_one_sglang_takes_as_it_is() -> None:
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    from verl_ext.gateway.engine import Sampling

    body = SGLangEngine("http://sglang:30000").request([1, 2, 3], Sampling(16, 0.7, 0.9, seed=5, stop_ids=(151658,)))
    assert body["input_ids"] == [1, 2, 3] and body["return_logprob"] is True
    assert body["sampling_params"] == {
        "max_new_tokens": 16,  # the gateway's budget, as it is
        "temperature": 0.7,
        "top_p": 0.9,
        "stop_token_ids": [151658],
        "sampling_seed": 5,  # as SGLang's OpenAI layer passes a seed
    }
    request = GenerateReqInput(**body)
    request.normalize_batch_and_arguments()
    params = SamplingParams(**request.sampling_params)
    params.normalize(None)
    params.verify(VOCAB)  # SGLang's own checks pass
    assert params.stop_token_ids == {151658} and params.sampling_seed == 5


def test_an_output_recorded_on_a_gpu_comes_back_as_recorded(gateway_parts: Any, tmp_path: Path) -> None:
    (recording,) = [r for r in load_recordings() if r["case"] == "logprobs"]
    # the recording forced a length finish with ignore_eos; the gateway never sends it (the output has no eos anyway)
    recording["request"]["sampling_params"].pop("ignore_eos")
    with sglang_server(RecordedTokenizerManager([recording])) as sglang:
        gateway = gateway_on(sglang.url, gateway_parts, tmp_path / "records")
        server = ServerThread(create_app(gateway, "policy")).start()
        try:
            sdk = openai.OpenAI(base_url=f"{server.url}/sessions/g/v1", api_key="k", max_retries=0)
            reply = sdk.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "Hello"}], max_tokens=6, temperature=1.0
            )
        finally:
            server.stop()
    recorded = recording["response"]
    assert reply.choices[0].model_extra["token_ids"] == recorded["output_ids"]
    assert reply.choices[0].finish_reason == "length" and reply.usage.prompt_tokens == 9
    (result,) = gateway.end("g")
    assert result.result.engine_ok
    _, (record,) = read_records(sorted((tmp_path / "records").glob("*.jsonl")))
    assert list(record.engine_calls[0].logprobs or ()) == [e[0] for e in recorded["meta_info"]["output_token_logprobs"]]


@pytest.mark.parametrize(
    ("fault", "words"),
    [
        ({"wrong_logprob_id_at": 1}, "logprob entries do not match its output ids (position 1"),
        ({"drop_logprob_entries": 2}, "logprob entries do not match its output ids"),
        ({"abort_after": 2}, "aborted the request"),
    ],
    ids=["wrong-id", "missing-entries", "abort"],
)
def test_an_engine_output_that_breaks_the_contract_is_an_engine_error(
    gateway_parts: Any, tmp_path: Path, fault: dict[str, Any], words: str
) -> None:
    tm = ScriptedTokenizerManager(EOS, VOCAB, [scripted(gateway_parts["tokenizer"], "Hi there.<|im_end|>", **fault)])
    with sglang_server(tm) as sglang:
        gateway = gateway_on(sglang.url, gateway_parts, tmp_path / "records")
        server = ServerThread(create_app(gateway, "policy")).start()
        try:
            sdk = openai.OpenAI(base_url=f"{server.url}/sessions/e/v1", api_key="k", max_retries=0)
            with pytest.raises(openai.InternalServerError) as failed:
                sdk.chat.completions.create(model="policy", messages=[{"role": "user", "content": "Hi"}], max_tokens=8)
        finally:
            server.stop()
    assert failed.value.status_code == 503 and failed.value.body["code"] == "engine_error"
    assert words in failed.value.body["message"], failed.value.body
    assert "e" not in gateway.sessions and "e" in gateway.ended  # ended, recorded and released


def test_the_shutdown_line_counts_the_failures_of_sessions_the_harness_ended(
    gateway_parts: Any, tmp_path: Path
) -> None:
    """SGLang samples an id of the model's padded head that the tokenizer cannot decode (SGLang bounds samples by the
    model's vocabulary, not the tokenizer's): the harness ends that session itself, another is still open at
    shutdown, and the line ``verl-ext gateway`` prints on shutdown counts the one engine-view failure among both, as
    the records show it."""
    from verl_ext.cli.gateway import shutdown_summary

    tokenizer = gateway_parts["tokenizer"]
    padding_id = len(tokenizer)  # in the model's vocabulary (VOCAB), past the tokenizer's
    assert padding_id < VOCAB
    broken = Script([*tokenizer.encode("Hi", add_special_tokens=False), padding_id, 151645])
    tm = ScriptedTokenizerManager(EOS, VOCAB, [broken, scripted(tokenizer, "Hello.<|im_end|>")])
    hi = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}
    with sglang_server(tm) as sglang:
        gateway = gateway_on(sglang.url, gateway_parts, tmp_path / "records")
        server = ServerThread(create_app(gateway, "policy")).start()
        try:
            answer = httpx.post(f"{server.url}/sessions/broken/v1/chat/completions", json=hi, timeout=120)
            assert answer.status_code == 200 and answer.json()["choices"][0]["finish_reason"] == "length", answer.text
            ended = httpx.post(f"{server.url}/sessions/broken/end", timeout=60).json()  # the harness ends it
            assert [b["engine_ok"] for b in ended["branches"]] == [False], ended
            too_long = httpx.post(f"{server.url}/sessions/fine/v1/chat/completions", json={**hi, "max_tokens": 4096})
            assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"
            answer = httpx.post(f"{server.url}/sessions/fine/v1/chat/completions", json=hi, timeout=120)
            assert answer.status_code == 200, answer.text
        finally:
            server.stop()
    gateway.end_all()  # as `verl-ext gateway` does on Ctrl-C: "fine" is still open
    line = shutdown_summary(gateway)
    assert "2 sessions served, 2 branches recorded" in line and line.endswith("engine-view failures 1"), line
    assert "context refusals 1," in line, line
    _, rollouts = read_records(sorted((tmp_path / "records").glob("*.jsonl")))
    checks = {r.extra["gateway"]["session"]: r.check for r in rollouts}
    assert sorted(checks) == ["broken", "fine"]
    assert [str(f.kind) for f in checks["broken"].engine_failures] == ["id_out_of_vocab"], checks["broken"]
    assert not checks["broken"].engine_ok and checks["fine"].engine_ok and not checks["fine"].engine_failures


def test_an_unreachable_server_is_named(tiny_qwen3_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from verl_ext.cli.main import main

    url = closed_port_url()
    with pytest.raises(EngineRequestError, match=f"no SGLang server answers at {url}"):
        SGLangEngine(url).check_reachable()
    assert main(["gateway", "--model", str(tiny_qwen3_dir), "--sglang-url", url]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--sglang-url: no SGLang server answers at {url}" in err, err


# Images: a VL model behind SGLang's own HTTP app, its multimodal processor (SGLang's QwenVLImageProcessor over the
# tiny VL processor) rebuilding each request's ids as on a GPU.

IMAGE_PAD, VIDEO_PAD, IM_END = 151655, 151656, 151645
HELLO, HEL, LO = 23811, 11338, 385  # Qwen2.5: " hello"; " hel" + "lo" is a non-canonical split of it


@pytest.fixture(scope="module")
def vl_parts(tokenizer_dirs: dict[str, Path]) -> dict[str, Any]:
    from PIL import Image

    from verl_ext.demo.vl_model import build_vl_processor

    load_sglang(vl=True)
    processor = build_vl_processor(tokenizer_dirs["qwen2.5"])
    images = [Image.new("RGB", (56, 56), (10, 20, 30)), Image.new("RGB", (56, 112), (40, 50, 60))]
    messages = [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Say hello to it."}]},
        {"role": "assistant", "content": '<tool_call>\n{"name": "screenshot", "arguments": {}}\n</tool_call>'},
        {"role": "tool", "content": [{"type": "image"}, {"type": "text", "text": "the screen"}]},
    ]
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    held = [int(i) for i in processor(text=[text], images=images, return_tensors="np")["input_ids"][0]]
    return {"processor": processor, "images": images, "held": held}


def vl_sglang(parts: dict[str, Any], *scripts: Script) -> ScriptedTokenizerManager:
    from sglang_standin import sglang_mm_processor

    mm = sglang_mm_processor(parts["processor"], parts["processor"].config)
    return ScriptedTokenizerManager(EOS, VOCAB, list(scripts), mm_processor=mm)


def test_images_reach_sglang_over_http_and_sglang_keeps_the_ids(vl_parts: dict[str, Any]) -> None:
    """PNG data URLs in placeholder order, each run written once; SGLang's own rebuild (its /generate, its
    tokenizer manager and Qwen-VL processor loading the data URLs) runs the model on exactly the session's ids."""
    import asyncio

    from verl_ext.engines.sglang_images import collapse_runs
    from verl_ext.gateway.engine import Sampling

    held, images = vl_parts["held"], vl_parts["images"]
    tm = vl_sglang(vl_parts, Script([10, IM_END]))
    with sglang_server(tm) as sglang:
        engine = SGLangEngine(sglang.url, processor=vl_parts["processor"])
        out = asyncio.run(engine.generate(held, Sampling(8), images=images))
    assert out.token_ids == (10, IM_END)
    (sent,) = tm.requests
    assert list(sent.input_ids) == collapse_runs(held, [IMAGE_PAD]) and len(sent.input_ids) < len(held)
    assert [u[:22] for u in sent.image_data] == ["data:image/png;base64,"] * 2
    assert tm.scheduled == [held]
    assert sent.sampling_params["logit_bias"] == {str(IMAGE_PAD): -1e9, str(VIDEO_PAD): -1e9}


def test_a_non_canonical_image_prompt_is_refused_before_sending(
    vl_parts: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's own rebuild (the model's processor) refuses it; with that check made to pass (the mutation),
    SGLang's rebuild runs the model on other ids than the session holds."""
    import asyncio

    from verl_ext.engines.sglang_images import ImagePromptRebuildError, RebuildCheck
    from verl_ext.gateway import sglang_engine
    from verl_ext.gateway.engine import Sampling

    held = vl_parts["held"]
    at = held.index(HELLO)
    prompt = [*held[:at], HEL, LO, *held[at + 1 :]]
    tm = vl_sglang(vl_parts, Script([10, IM_END]))
    with sglang_server(tm) as sglang:
        engine = SGLangEngine(sglang.url, processor=vl_parts["processor"])
        with pytest.raises(ImagePromptRebuildError, match=rf"at position {at} .*non-canonical.*engine_error"):
            asyncio.run(engine.generate(prompt, Sampling(8), images=vl_parts["images"]))
        assert tm.requests == []
        monkeypatch.setattr(sglang_engine, "compare_rebuild", lambda *a, **k: RebuildCheck(True, 0, 0, None, ""))
        tm.scripts.append(Script([10, IM_END]))
        with pytest.raises(EngineRequestError, match="ran the image prompt as"):  # caught after: counts differ
            asyncio.run(engine.generate(prompt, Sampling(8), images=vl_parts["images"]))
    assert tm.scheduled == [held]  # SGLang re-encoded " hello" canonically


def test_images_without_the_models_processor_are_refused(vl_parts: dict[str, Any]) -> None:
    import asyncio

    from verl_ext.gateway.engine import Sampling

    engine = SGLangEngine("http://127.0.0.1:9")
    with pytest.raises(EngineRequestError, match="no processor of the served model"):
        asyncio.run(engine.generate(vl_parts["held"], Sampling(8), images=vl_parts["images"]))


SAMPLED = [
    "Sure, hello there!",
    'I will call {"name": "screenshot", "arguments": {"region": "top"}} now.',
    "The total is 12,345.67 — café prices rose 3%.",
    "  indented\n\tcode = f(x) + 1;  ",
    "Größe: 42 cm; 東京 is in Japan.",
]


def _split_one(tokenizer: Any, ids: list[int], which: int) -> list[int]:
    """``ids`` with one multi-character token re-encoded as two pieces (a non-canonical split a model may sample),
    or ``ids`` unchanged when no token splits."""
    candidates = [i for i, t in enumerate(ids) if len(tokenizer.decode([t])) > 2]
    if not candidates:
        return ids
    at = candidates[which % len(candidates)]
    text = tokenizer.decode([ids[at]])
    half = len(text) // 2
    pieces = tokenizer.encode(text[:half], add_special_tokens=False) + tokenizer.encode(
        text[half:], add_special_tokens=False
    )
    return [*ids[:at], *pieces, *ids[at + 1 :]]


def test_the_gateways_rebuild_agrees_with_sglangs_own(vl_parts: dict[str, Any]) -> None:
    """Property: for prompts holding a sampled turn as a model writes it (canonical, or with one token split) and
    images of random sizes, the gateway's proof (the model's processor) passes exactly when SGLang's own rebuild
    (its Qwen-VL processor, legacy path) gives back the prompt's ids."""
    import asyncio

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from PIL import Image
    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang_standin import global_server_args, sglang_mm_processor

    from verl_ext.engines.sglang_images import ImagePromptRebuildError

    processor = vl_parts["processor"]
    tokenizer = processor.tokenizer
    mm = sglang_mm_processor(processor, processor.config)
    engine = SGLangEngine("http://unused:1", processor=processor)
    sizes = st.tuples(st.integers(28, 140), st.integers(28, 140))
    outcomes: set[bool] = set()

    @settings(max_examples=14, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.sampled_from(SAMPLED), st.booleans(), st.integers(0, 50), st.lists(sizes, min_size=1, max_size=3))
    def check(sampled: str, split: bool, which: int, image_sizes: list[tuple[int, int]]) -> None:
        images = [Image.new("RGB", size, (i * 40, 90, 160)) for i, size in enumerate(image_sizes)]
        user = {"role": "user", "content": [*({"type": "image"} for _ in images), {"type": "text", "text": "Go."}]}
        head = processor.apply_chat_template([user], tokenize=False, add_generation_prompt=True)
        head_ids = [int(i) for i in processor(text=[head], images=images, return_tensors="np")["input_ids"][0]]
        turn = tokenizer.encode(sampled, add_special_tokens=False)
        turn = _split_one(tokenizer, turn, which) if split else turn
        tail = tokenizer.encode("<|im_end|>\n<|im_start|>user\nAnd?<|im_end|>\n<|im_start|>assistant\n")
        ids = head_ids + turn + tail
        obj = GenerateReqInput(rid="p", input_ids=list(ids), image_data=list(images), sampling_params={})
        with global_server_args():
            rebuilt = asyncio.run(
                mm.process_mm_data_async(image_data=list(images), input_text=list(ids), request_obj=obj)
            )
        sglang_keeps = list(rebuilt.input_ids) == ids
        try:
            engine.prove_images(ids, images)
            proven = True
        except ImagePromptRebuildError:
            proven = False
        assert proven == sglang_keeps, (sampled, split, image_sizes)
        outcomes.add(proven)

    check()
    assert outcomes == {True, False}  # both kept and rebuilt-otherwise prompts were met
