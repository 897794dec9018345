"""End to end with images: `verl-ext demo --model qwen2.5-vl` runs one step of verl's real GRPO trainer (Ray, FSDP2
on gloo, the CPU engine) with verl_ext_tool_agent, a tiny random Qwen2.5-VL, a prompt image per row (verl's
``images`` column through ``RLHFDataset``) and the screenshot tool, whose every result holds an image.

verl builds the processor itself here (``hf_processor``: AutoProcessor through the model folder's remote-code class,
torchvision being missing), computes ``multi_modal_inputs`` and the mrope positions from the loop's
``multi_modal_data``, and recomputes every sampled token's logprob with the images: the rollout-vs-trainer logprob
difference is the evidence that the trainer saw the engine's pixels at the engine's positions."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_docs_commands import demo_output_shape, documented_commands, printed_lines

from verl_ext.cli.main import main as cli
from verl_ext.demo.run import DemoResult, run_demo

pytestmark = [pytest.mark.timeout(900), pytest.mark.xdist_group("ray")]  # a trainer start: the Ray group

IMAGE_FAILURES = ("image_dropped", "image_order", "image_expansion", "image_trained", "image_span")


@pytest.fixture(scope="module")
def vl_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoResult, list[str]]:
    lines: list[str] = []
    result = run_demo(tmp_path_factory.mktemp("demo-vl"), steps=1, model="qwen2.5-vl", say=lines.append)
    assert result.returncode == 0, "\n".join(lines)
    return result, lines


def rollouts(result: DemoResult) -> list[dict[str, Any]]:
    records = [json.loads(x) for f in (result.out / "records").glob("*.jsonl") for x in f.read_text().splitlines()]
    return [r for r in records if r["type"] == "rollout"]


def test_a_grpo_step_trains_on_the_engines_images(vl_demo: tuple[DemoResult, list[str]]) -> None:
    result, lines = vl_demo
    assert sorted(result.steps) == [1], lines
    metrics = result.steps[1]
    assert metrics["actor/grad_norm"] > 0
    # the trainer recomputes each sampled token's logprob from the ids, pixels and mrope positions verl built from
    # the loop's multi_modal_data: a dropped, swapped or misplaced image would move them far past this
    assert metrics["training/rollout_probs_diff_max"] < 1e-3
    assert metrics["num_turns/mean"] >= 4  # system+user with an image, the screenshot call, its image result, more
    # the same, per token in logprobs: every rollout measured (depth counts the prompt's image tokens), none drifts
    assert metrics["tito/numerics/rollouts"] == 4 and metrics["tito/numerics/numerics_unavailable"] == 0
    assert metrics["tito/numerics/drift_rollouts"] == 0 and metrics["tito/numerics/max_abs_delta"] < 1e-3
    assert metrics["tito/numerics/tokens"] == metrics["tito/sampled_tokens"]


def test_engine_view_and_image_view_pass(vl_demo: tuple[DemoResult, list[str]]) -> None:
    metrics = vl_demo[0].steps[1]
    assert metrics["tito/rollouts_checked"] == 4 and metrics["tito/engine_view_failures"] == 0
    for kind in IMAGE_FAILURES:
        assert metrics[f"tito/engine_view/{kind}"] == 0
    assert metrics["tito/tool/calls"] == 4 and metrics["tito/tool/ok"] == 4


def test_records_hold_each_image_span_and_digest(vl_demo: tuple[DemoResult, list[str]]) -> None:
    records = rollouts(vl_demo[0])
    assert len(records) == 4 and all(r["check"]["engine_ok"] for r in records)
    screenshots = set()
    for record in records:
        images = record["images"]
        engine, trainer = images["engine"], images["trainer"]
        assert len(engine) == 2  # the prompt's icon, then the screenshot the tool returned
        assert [e["digest"] for e in engine] == [t["digest"] for t in trainer]
        assert all(e["length"] > 0 for e in engine)
        assert engine[0]["position"] < engine[1]["position"]
        screenshots.add(engine[1]["digest"])
    assert len(screenshots) == 1  # every rollout asked for the same region: one picture


def test_report_and_replay_read_the_image_records(
    vl_demo: tuple[DemoResult, list[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    result, _ = vl_demo
    assert result.report is not None and "Engine view: 0 failures" in result.report.read_text()
    # one thumbnail per distinct image beside the records, embedded in the report beside each image's span
    digests = {e["digest"] for r in rollouts(result) for e in r["images"]["engine"]}
    thumbnails = {p.stem for p in (result.out / "records" / "thumbnails").glob("*.png")}
    assert thumbnails == digests
    html = result.report.read_text()
    assert "data:image/png;base64," in html and "thumbnail missing" not in html
    files = sorted(str(f) for f in (result.out / "records").glob("*.jsonl"))
    code = cli(["replay", *files, "--tokenizer", str(result.out / "tiny-qwen2.5-vl")])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("images: 2 image(s) replayed") == 4 and out.count("recorded stream: the same ") == 4


def test_the_docs_show_what_the_vl_demo_prints(vl_demo: tuple[DemoResult, list[str]]) -> None:
    """docs/vl-models.md's output of the VL demo is one run's: the same lines in the same order, numbers aside."""
    result, lines = vl_demo
    (shown,) = [c.shown for c in documented_commands() if c.where.startswith("docs/vl-models.md") and c.shown]
    assert shown[0].startswith("verl-ext demo: 1 GRPO step of verl's v1 trainer") and shown[-1].startswith("done in ")
    printed = printed_lines(lines, str(result.out), "build/demo-vl")
    assert demo_output_shape(shown[1:-1]) == demo_output_shape(printed)
