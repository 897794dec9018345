"""Images through the gateway, with the real SDKs: OpenAI ``image_url`` parts, Anthropic ``image`` blocks and Responses
``input_image`` parts, in the first prompt and in tool results, served on the CPU engine by the tiny random
Qwen2.5-VL (scripted turns: a random model writes no tool call). Each image reaches the engine expanded as the
processor expands it, the record holds the image digests, the check's image view passes, and the record replays.
Bad images and images for a model without an image side are 400s naming the field and the cause."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
import json
import sys
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from replay_checks import assert_records_replay
from vl_rollouts import TOOLS, make_image

from verl_ext.core.images import image_digest
from verl_ext.gateway.server import ServerThread, create_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))
from gateway_fixtures import Script  # noqa: E402

SHOT = '<tool_call>\n{"name": "screenshot", "arguments": {"region": "top"}}\n</tool_call><|im_end|>'
DONE = "The screen is grey.<|im_end|>"
PLACEHOLDER = "<|image_pad|>"


def png(image: Any) -> str:
    """The image as base64 PNG bytes."""
    out = io.BytesIO()
    image.save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def data_url(image: Any) -> str:
    return "data:image/png;base64," + png(image)


@pytest.fixture(scope="module")
def vl_parts(tiny_vl_dir: Path, vl_processor: Any, vl_renderer: Any) -> dict[str, Any]:
    """What every gateway here shares, built once: the CPU engine serving the tiny VL model (turns scripted), the
    runtime, the tool-call reader and the image side ``gateway_vision`` derives from the processor."""
    from verl_ext.gateway.cpu_engine import CPUEngine
    from verl_ext.gateway.local import gateway_vision
    from verl_ext.gateway.parsing import ToolCallReader, reasoning_markers
    from verl_ext.runtime import RolloutRuntime

    script = Script(vl_processor.tokenizer)
    engine = CPUEngine(str(tiny_vl_dir), teacher_force=script)
    vision, why = gateway_vision(tiny_vl_dir, vl_renderer, engine, vl_processor)
    assert vision is not None, why
    return {
        "engine": engine,
        "script": script,
        "runtime": RolloutRuntime.build(vl_renderer),
        "reader": ToolCallReader(vl_renderer.tokenizer, "hermes"),
        "markers": reasoning_markers(vl_renderer.tokenizer),
        "vision": vision,
    }


@pytest.fixture
def serve_vl(vl_parts: dict[str, Any], tmp_path: Path) -> Any:
    """``serve_vl(turns)``: a gateway on the VL engine (records under tmp_path/records) behind a live server; every
    record it wrote must replay after the test."""
    from verl_ext.gateway.service import Gateway
    from verl_ext.telemetry.records import RecordWriter, header_record
    from verl_ext.telemetry.thumbnails import ThumbnailWriter, thumbnails_folder

    servers: list[ServerThread] = []
    runtime = vl_parts["runtime"]

    def start(turns: list[str]) -> tuple[Any, ServerThread]:
        vl_parts["script"].turns = list(turns)
        writer = RecordWriter(tmp_path / "records", header_record(runtime.profile), prefix="gateway")
        thumbnails = ThumbnailWriter(thumbnails_folder(tmp_path / "records"))  # as RolloutRuntime.build makes it
        gateway = Gateway(
            vl_parts["engine"],
            dataclasses.replace(runtime.with_writer(writer), thumbnails=thumbnails),
            vl_parts["reader"],
            markers=vl_parts["markers"],
            vision=vl_parts["vision"],
        )
        # The gateway keeps no result of an ended session (the caller of ``end`` takes them): the tests read them
        # from what /end concluded, in the order the sessions ended.
        gateway.taken = []
        end_session = gateway.end

        def end_and_keep(*args: Any, **kwargs: Any) -> Any:
            results = end_session(*args, **kwargs)
            gateway.taken += results
            return results

        gateway.end = end_and_keep
        server = ServerThread(create_app(gateway, "tiny-vl")).start()
        servers.append(server)
        return gateway, server

    yield start
    for server in servers:
        server.stop()
    if (tmp_path / "records").is_dir():
        assert_records_replay(tmp_path / "records", runtime.renderer)


def end(server: ServerThread, session: str) -> dict[str, Any]:
    response = httpx.post(f"{server.url}/sessions/{session}/end", timeout=60)
    response.raise_for_status()
    return response.json()


def _records(gateway: Any, session: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in Path(gateway.writer.path).read_text().splitlines()]
    return [
        line
        for line in lines
        if line.get("type") == "rollout" and line.get("index") == session and line["gateway"]["branch"] == 0
    ]


def _assert_images_served(gateway: Any, session: str, images: list[Any]) -> None:
    """One branch, checked clean, whose stream holds each image expanded to its grid's count, in order, and whose
    record holds their digests."""
    (result,) = [r for r in gateway.taken if r.session == session and r.branch == 0]
    assert result.result.engine_ok, result.result.engine.failures
    spans = result.rollout.extra["images"]["engine"]
    assert [s["digest"] for s in spans] == [image_digest(i) for i in images]
    expected = [gateway.vision.expand(i).length for i in images]
    assert [s["length"] for s in spans] == expected
    stream = result.rollout.sample.stream
    placeholder = gateway.vision.profile.placeholder_id
    assert [list(stream[s["position"] : s["position"] + s["length"]]) for s in spans] == [
        [placeholder] * n for n in expected
    ]
    assert sum(1 for t in stream if t == placeholder) == sum(expected)
    (record,) = _records(gateway, session)
    parts = [p for m in record["messages"] if isinstance(m["content"], list) for p in m["content"]]
    assert [p["digest"] for p in parts if p["type"] == "image"] == [image_digest(i) for i in images]
    # every engine call's record holds the images it was given, and the image view compared them with its prompt's
    from verl_ext.check.record import RolloutRecord, recorded_call_images

    assert result.result.image_calls_unchecked == "" and record["check"]["image_calls_unchecked"] == ""
    per_call = recorded_call_images(RolloutRecord.from_json(record).engine_calls)
    assert all(digests is not None for _, digests in per_call)
    assert per_call[-1][1] == tuple(image_digest(i) for i in images)


def test_openai_image_url_in_prompt_and_tool_result(
    serve_vl: Any, tiny_vl_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gateway, server = serve_vl([SHOT, DONE])
    sdk = openai.OpenAI(base_url=f"{server.url}/sessions/a/v1", api_key="x", max_retries=0)
    first, shot = make_image(100, 100, 1), make_image(56, 112, 2)
    messages: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is on the screen?"},
                {"type": "image_url", "image_url": {"url": data_url(first)}},
            ],
        }
    ]
    reply = sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=48)
    call = reply.choices[0].message.tool_calls[0]
    assert call.function.name == "screenshot"
    messages += [
        reply.choices[0].message.model_dump(exclude_none=True),
        {
            "role": "tool",
            "tool_call_id": call.id,
            "content": [
                {"type": "image_url", "image_url": {"url": data_url(shot)}},
                {"type": "text", "text": "the top of the screen"},
            ],
        },
    ]
    answer = sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=48)
    assert answer.choices[0].message.content == "The screen is grey."
    assert gateway.counters["forks"] == 0  # the images sent back matched by digest
    # the same history with another first image departs from the session there: a fork naming the content
    other = [
        {
            **messages[0],
            "content": [
                messages[0]["content"][0],
                {"type": "image_url", "image_url": {"url": data_url(make_image(100, 100, 9))}},
            ],
        }
    ]
    forked = sdk.chat.completions.create(model="m", messages=other, tools=TOOLS, max_tokens=48)
    assert gateway.counters["forks"] == 1 and forked.choices[0].message.tool_calls
    assert gateway.sessions["a"].branches[1].fork.divergence.field == "content"
    end(server, "a")
    _assert_images_served(gateway, "a", [first, shot])

    # each distinct image of the session's branches has one thumbnail beside the records
    stems = {p.stem for p in (Path(gateway.writer.path).parent / "thumbnails").iterdir()}
    assert stems == {image_digest(im) for im in (first, shot, make_image(100, 100, 9))}
    # the report marks where each image's placeholder run starts
    from verl_ext.check.record import RolloutRecord
    from verl_ext.report.tokens import Marker, token_view

    (line,) = _records(gateway, "a")
    items = token_view(RolloutRecord.from_json(line, "a"), gateway.renderer.decode)
    marks = [m for m in items if isinstance(m, Marker) and m.image]
    assert [m.number for m in marks] == ["I0", "I1"] and str(image_digest(shot)) in marks[1].title

    # replay (the fixture replays every record at teardown: the image blocks at the record's counts reproduce the
    # stream); a record without the counts is replayed as the template writes the blocks: said, never "differs"
    from verl_ext.cli.main import main

    path = Path(gateway.writer.path)
    stripped = tmp_path / "no-counts.jsonl"
    stripped.write_text(
        "\n".join(json.dumps(_without_counts(json.loads(line))) for line in path.read_text().splitlines()) + "\n"
    )
    assert main(["replay", str(stripped), "--tokenizer", str(tiny_vl_dir)]) == 0
    out = capsys.readouterr().out
    assert "2 of 2 image part(s) give no placeholder count" in out and "recorded stream: not compared" in out
    assert "DIFFERS" not in out


def test_an_engine_call_handed_its_images_swapped_is_caught(serve_vl: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The defect: the gateway hands its engine a call's images in another order. The CPU engine (as verl's own count
    check) compares only the total placeholder count and serves it; the image view names the call."""
    from verl_ext.gateway.service import Gateway

    real = Gateway._generate

    async def swapping(self: Any, session: Any, prompt: Any, sampling: Any, images: Any = None) -> Any:
        return await real(self, session, prompt, sampling, None if images is None else list(images)[::-1])

    monkeypatch.setattr(Gateway, "_generate", swapping)
    gateway, server = serve_vl([SHOT, DONE])
    sdk = openai.OpenAI(base_url=f"{server.url}/sessions/s/v1", api_key="x", max_retries=0)
    user = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(make_image(100, 100, 1))}}]}
    reply = sdk.chat.completions.create(model="m", messages=[user], tools=TOOLS, max_tokens=48)
    call = reply.choices[0].message.tool_calls[0]
    tool = {
        "role": "tool",
        "tool_call_id": call.id,
        "content": [{"type": "image_url", "image_url": {"url": data_url(make_image(56, 112, 2))}}],
    }
    messages = [user, reply.choices[0].message.model_dump(exclude_none=True), tool]
    sdk.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=48)
    end(server, "s")
    (result,) = [r for r in gateway.taken if r.session == "s"]
    assert [(f.kind.value, f.turn) for f in result.result.engine_failures] == [("image_engine_mismatch", 1)]


def _without_counts(line: dict[str, Any]) -> dict[str, Any]:
    """A record line whose image parts lack their placeholder counts (a record written by hand)."""
    for message in line.get("messages", ()):
        for part in message["content"] if isinstance(message["content"], list) else ():
            part.pop("tokens", None)
    return line


def test_anthropic_and_responses_images(serve_vl: Any) -> None:
    gateway, server = serve_vl([SHOT, DONE])
    first, shot = make_image(56, 56, 3), make_image(84, 56, 4)
    sdk = anthropic.Anthropic(base_url=f"{server.url}/sessions/b", api_key="x", max_retries=0)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png(first)}}
    tools = [
        {"name": "screenshot", "description": "Take a screenshot.", "input_schema": TOOLS[0]["function"]["parameters"]}
    ]
    user = {"role": "user", "content": [image, {"type": "text", "text": "What is on the screen?"}]}
    reply = sdk.messages.create(model="m", max_tokens=48, tools=tools, messages=[user])
    use = next(b for b in reply.content if b.type == "tool_use")
    result_image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png(shot)}}
    result = {"type": "tool_result", "tool_use_id": use.id, "content": [result_image]}
    history = [user, {"role": "assistant", "content": [b.model_dump() for b in reply.content]}]
    sdk.messages.create(
        model="m", max_tokens=48, tools=tools, messages=[*history, {"role": "user", "content": [result]}]
    )
    end(server, "b")
    _assert_images_served(gateway, "b", [first, shot])

    gateway, server = serve_vl([SHOT, DONE])
    sdk_r = openai.OpenAI(base_url=f"{server.url}/sessions/c/v1", api_key="x", max_retries=0)
    rtools = [{"type": "function", "name": "screenshot", "parameters": TOOLS[0]["function"]["parameters"]}]
    items: list[Any] = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is on the screen?"},
                {"type": "input_image", "image_url": data_url(first), "detail": "auto"},
            ],
        }
    ]
    response = sdk_r.responses.create(model="m", input=items, tools=rtools, max_output_tokens=48)
    fc = next(i for i in response.output if i.type == "function_call")
    items += [i.model_dump(exclude_none=True) for i in response.output]
    items.append(
        {
            "type": "function_call_output",
            "call_id": fc.call_id,
            "output": [{"type": "input_image", "image_url": data_url(shot)}, {"type": "input_text", "text": "top"}],
        }
    )
    sdk_r.responses.create(model="m", input=items, tools=rtools, max_output_tokens=48)
    end(server, "c")
    _assert_images_served(gateway, "c", [first, shot])


def test_bad_images_and_a_model_without_images_are_400s(serve_vl: Any) -> None:
    from verl_ext.gateway.service import Gateway

    gateway, server = serve_vl([DONE])
    sdk = openai.OpenAI(base_url=f"{server.url}/sessions/d/v1", api_key="x", max_retries=0)

    def refused(url: str) -> Any:
        part = {"type": "image_url", "image_url": {"url": url}}
        with pytest.raises(openai.BadRequestError) as err:
            sdk.chat.completions.create(model="m", messages=[{"role": "user", "content": [part]}], max_tokens=4)
        return err.value.body

    where = "messages[0].content[0].image_url.url"
    http = refused("https://example.com/cat.png")
    assert http["param"] == where and "fetches no images" in http["message"] and http["code"] == "unsupported"
    assert "not valid base64" in refused("data:image/png;base64,@@@")["message"]
    assert (
        "cannot be decoded as an image"
        in refused("data:image/png;base64," + base64.b64encode(b"nope").decode())["message"]
    )
    assert "media type 'image/tiff' is not served" in refused("data:image/tiff;base64,AAAA")["message"]
    assert (
        "declared image/jpeg but the bytes are PNG"
        in refused("data:image/jpeg;base64," + png(make_image(8, 8)))["message"]
    )
    assert "d" not in gateway.sessions or not gateway.sessions["d"].branches  # nothing of a refused request was kept

    # the engine itself refuses a prompt holding image placeholders sent without its images
    from verl_ext.core.errors import EngineRequestError
    from verl_ext.gateway.engine import Sampling

    pad = gateway.vision.profile.placeholder_id
    with pytest.raises(EngineRequestError, match="holds 4 image placeholder tokens but the request has no images"):
        asyncio.run(gateway.engine.generate([pad] * 4, Sampling(2)))

    # the same engine, served as a model without an image side: the image is refused naming the cause
    text_only = Gateway(gateway.engine, gateway.runtime, gateway.reader, no_images="the test's model has no eyes")
    server2 = ServerThread(create_app(text_only, "text")).start()
    try:
        sdk2 = openai.OpenAI(base_url=f"{server2.url}/sessions/e/v1", api_key="x", max_retries=0)
        part = {"type": "image_url", "image_url": {"url": data_url(make_image(56, 56))}}
        with pytest.raises(openai.BadRequestError) as err:
            sdk2.chat.completions.create(model="m", messages=[{"role": "user", "content": [part]}], max_tokens=4)
        assert err.value.body["param"] == "messages[0].content[0]"
        assert "the test's model has no eyes" in err.value.body["message"]
    finally:
        server2.stop()


def test_gateway_vision_names_why_images_are_refused(
    tiny_vl_dir: Path, vl_renderer: Any, vl_processor: Any, tmp_path: Path
) -> None:
    from verl_ext.gateway.local import gateway_vision

    class TextEngine:  # an engine that takes no images
        max_context = None

    class ImageEngine(TextEngine):
        takes_images = True

    assert gateway_vision(tmp_path, vl_renderer, ImageEngine())[1].startswith("the served model is text-only")
    assert "takes no images" in gateway_vision(tiny_vl_dir, vl_renderer, TextEngine(), vl_processor)[1]
    text_only = "{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}"
    text_renderer = type(vl_renderer)(vl_renderer.tokenizer, chat_template=text_only)
    why = gateway_vision(tiny_vl_dir, text_renderer, ImageEngine(), vl_processor)[1]
    assert why.startswith("the model's processor and chat template cannot serve images") and "text-only" in why


def test_check_template_audits_the_vl_processor(
    tiny_vl_dir: Path, vl_renderer: Any, vl_processor: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from verl_ext.cli.main import main

    assert main(["check-template", str(tiny_vl_dir), "--json"]) == 0
    vision = json.loads(capsys.readouterr().out)["vision"]
    assert vision["verdict"] == "supported" and vision["profile"]["placeholder_id"] == 151655
    assert vision["profile"]["before_ids"] == [151652] and vision["profile"]["after_ids"] == [151653]
    assert vision["profile"]["grid_key"] == "image_grid_thw" and vision["profile"]["divisor"] == 4
    assert {"size": [224, 224], "grid": [1, 16, 16], "placeholders": 64} in vision["examples"]
    # the same processor with a template that writes nothing for an image block: refused, with the cause
    from verl_ext.cli.vision_audit import audit_vision

    text_only = "{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}"
    refused = audit_vision(type(vl_renderer)(vl_renderer.tokenizer, chat_template=text_only), tiny_vl_dir, vl_processor)
    assert refused is not None and refused.verdict == "unsupported" and "it is a text-only template" in refused.refused
    assert "images: unsupported" in refused.lines(vl_renderer)[0]


def test_history_keys_images_by_their_pixels() -> None:
    """The same picture sent twice (decoded anew each time) is the same message; another picture is not, and the
    divergence names the content."""
    from verl_ext.gateway.history import divergence, message_key
    from verl_ext.gateway.request import parse_chat_request

    def message(image: Any) -> dict[str, Any]:
        parts = [{"type": "text", "text": "Look."}, {"type": "image_url", "image_url": {"url": data_url(image)}}]
        return parse_chat_request({"messages": [{"role": "user", "content": parts}]}).messages[0]

    a, again, other = message(make_image(56, 56, 1)), message(make_image(56, 56, 1)), message(make_image(56, 56, 2))
    assert a["content"][1]["image"] is not again["content"][1]["image"]
    assert message_key(a) == message_key(again) != message_key(other)
    assert divergence([other], [a], 0).field == "content"
