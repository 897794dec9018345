"""The image token core: the probe derives placeholder, boundaries and expansion rule from the processor and the
template (and refuses what it cannot serve); ImageTrajectory's ids equal the processor's one-shot expansion."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from vl_rollouts import TOOLS, make_image

from verl_ext.core.errors import TemplateError, TrajectoryError
from verl_ext.core.image_trajectory import ImageTrajectory
from verl_ext.core.images import ImageTokens, image_digest, images_in, probe_vision
from verl_ext.core.rendering import ChatRenderer

CALL = '<tool_call>\n{"name": "screenshot", "arguments": {}}\n</tool_call><|im_end|>'
ASSISTANT = {
    "role": "assistant",
    "content": "",
    "tool_calls": [{"type": "function", "function": {"name": "screenshot", "arguments": {}}}],
}


def test_probe_derives_qwen_vl_placeholder_boundaries_and_rule(vision_profile: Any, vl_renderer: ChatRenderer) -> None:
    tok = vl_renderer.tokenizer
    assert vision_profile.placeholder_id == tok.convert_tokens_to_ids("<|image_pad|>")
    assert vision_profile.before_ids == (tok.convert_tokens_to_ids("<|vision_start|>"),)
    assert vision_profile.after_ids == (tok.convert_tokens_to_ids("<|vision_end|>"),)
    assert vision_profile.grid_key == "image_grid_thw"
    assert vision_profile.divisor == 4  # merge 2 x 2, read from the processor, not written anywhere in verl_ext
    assert vision_profile.expected_length((1, 8, 8)) == 16


@pytest.mark.parametrize(
    ("size", "grid", "pads"),
    [((56, 56), (1, 4, 4), 4), ((100, 100), (1, 8, 8), 16), ((56, 112), (1, 8, 4), 8), ((28, 28), (1, 4, 4), 4)],
)
def test_expansion_is_the_processors(image_tokens: ImageTokens, size: tuple[int, int], grid: tuple, pads: int) -> None:
    expanded = image_tokens.expand(make_image(*size))
    assert (expanded.grid, expanded.length) == (grid, pads)


def test_text_only_template_is_refused_with_the_cause(vl_processor: Any, tokenizer_dirs: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    text_only = ChatRenderer(AutoTokenizer.from_pretrained(str(tokenizer_dirs["qwen2.5"])))  # Qwen2.5's own template
    with pytest.raises(TemplateError, match="cannot render list content with an image block"):
        probe_vision(text_only, vl_processor, make_image)


def test_template_ignoring_images_is_refused(vl_processor: Any, vl_renderer: ChatRenderer) -> None:
    ignores = vl_renderer.with_chat_template(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{{ m.content }}{% else %}"
        "{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    with pytest.raises(TemplateError, match="renders nothing for an image block: it is a text-only template"):
        probe_vision(ignores, vl_processor, make_image)


class _FixedCount:
    """A processor of a fixed-count family: every image becomes 3 placeholders, no grid."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __call__(self, *, text: list[str], images: list[Any], return_tensors: str) -> dict[str, Any]:
        pad = "<|image_pad|>"
        ids = self.inner.tokenizer(text[0].replace(pad, pad * 3))["input_ids"]
        return {"input_ids": [ids], "attention_mask": [[1] * len(ids)]}


class _NoExpansion(_FixedCount):
    def __call__(self, *, text: list[str], images: list[Any], return_tensors: str) -> dict[str, Any]:
        ids = self.inner.tokenizer(text[0])["input_ids"]
        return {"input_ids": [ids], "attention_mask": [[1] * len(ids)], "image_grid_thw": [[1, 2, 2]]}


@pytest.mark.parametrize(
    ("processor", "why"),
    [(_FixedCount, "fixed-count family"), (_NoExpansion, "does not expand images into tokens")],
)
def test_processors_the_probe_cannot_serve_are_refused(
    processor: type, why: str, vl_processor: Any, vl_renderer: ChatRenderer
) -> None:
    with pytest.raises(TemplateError, match=why):
        probe_vision(vl_renderer, processor(vl_processor), make_image)


def _tool_rollout(t: ImageTrajectory, first: list[Any], tool_images: list[Any]) -> list[dict[str, Any]]:
    prompt = [
        {
            "role": "user",
            "content": [
                *({"type": "image", "image": im} for im in first),
                {"type": "text", "text": "What is on the screen?"},
            ],
        }
    ]
    t.start(prompt, TOOLS)
    t.add_sampled(t.renderer.encode(CALL), None, "stop", ASSISTANT)
    tool = [
        {
            "role": "tool",
            "content": [
                *({"type": "image", "image": im} for im in tool_images),
                {"type": "text", "text": "screenshot taken"},
            ],
        }
    ]
    t.append_messages(tool)
    return [*prompt, ASSISTANT, *tool]


def test_trajectory_ids_equal_the_processors_one_shot_expansion(
    vl_renderer: ChatRenderer, vl_processor: Any, image_tokens: ImageTokens
) -> None:
    first, tool_images = [make_image(100, 100, 1)], [make_image(56, 112, 2), make_image(300, 200, 3)]
    t = ImageTrajectory(vl_renderer, image_tokens=image_tokens)
    messages = _tool_rollout(t, first, tool_images)
    text = vl_renderer.render_text(messages, TOOLS, add_generation_prompt=True)
    one_shot = vl_processor(text=[text], images=first + tool_images, return_tensors="np")
    assert list(t.input_ids) == one_shot["input_ids"][0].tolist()
    assert [list(s.grid) for s in t.image_spans] == one_shot["image_grid_thw"].tolist()
    pad = image_tokens.profile.placeholder_id
    mask = t.loss_mask
    for span, image in zip(t.image_spans, first + tool_images, strict=True):
        assert t.input_ids[span.position : span.position + span.length] == [pad] * span.length
        assert t.input_ids[span.position - 1] == image_tokens.profile.before_ids[-1]
        assert t.input_ids[span.position + span.length] == image_tokens.profile.after_ids[0]
        assert set(mask[span.position : span.position + span.length]) == {0}
        assert span.digest == image_digest(image)
    assert [s.turn for s in t.image_spans] == [0, 1, 1]
    assert t.multi_modal_data() == {"images": first + tool_images}
    assert t.to_dict()["images"][1]["length"] == 8


def test_images_the_template_drops_are_refused(vl_renderer: ChatRenderer, image_tokens: ImageTokens) -> None:
    drops_tool_images = vl_renderer.with_chat_template(
        (vl_renderer.chat_template or "").replace(
            "{{- render_content(message.content) }}\n        {{- '\\n</tool_response>' }}",
            "{%- if message.content is string %}{{ message.content }}{% else %}{% for p in message.content %}"
            "{% if p.type == 'text' %}{{ p.text }}{% endif %}{% endfor %}{% endif %}"
            "\n        {{- '\\n</tool_response>' }}",
        )
    )
    assert drops_tool_images.chat_template != vl_renderer.chat_template  # the guard below is reached
    t = ImageTrajectory(drops_tool_images, image_tokens=image_tokens)
    with pytest.raises(TrajectoryError, match=r"hold 1 image\(s\) the template rendered no placeholder for"):
        _tool_rollout(t, [make_image(56, 56)], [make_image(56, 56, 5)])


def test_images_in_reads_verl_and_openai_parts() -> None:
    a, b = make_image(56, 56, 1), "data:image/png;base64,AAAA"
    messages = [
        {"role": "user", "content": [{"type": "image", "image": a}, {"type": "text", "text": "x"}]},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": b}}]},
    ]
    assert images_in(messages) == [a, b]


def test_core_image_modules_import_no_torch_numpy_or_pil() -> None:
    core = Path(__file__).resolve().parents[2] / "verl_ext" / "core"
    for name in ("images.py", "image_trajectory.py"):
        tree = ast.parse((core / name).read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not imported & {"torch", "numpy", "PIL", "verl", "ray"}, (name, imported)
