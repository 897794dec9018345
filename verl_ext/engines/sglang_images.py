"""Images on verl_ext's SGLang server (sglang_server.py): the request SGLang 0.5.12's token API takes, the proof that
SGLang keeps the prompt's ids, and the placeholder ban. Importable without SGLang: SGLang's objects are passed in.

SGLang 0.5.12 takes a token-in request with images as ``GenerateReqInput(input_ids=..., image_data=[...])``: the ids
hold each image's placeholder run expanded (as verl_ext's trajectory and verl's token builders write them), the
images come in placeholder order. It does not keep those ids: for any request with images its tokenizer manager
hands them to the model's multimodal processor, which decodes them to text, rewrites each
``<|vision_start|><|image_pad|>...<|vision_end|>`` run to one unexpanded block (its legacy path, taken under
``skip_tokenizer_init``), and runs the HF processor on that text and the images; the ids it returns replace the
request's (``TokenizerManager._tokenize_one_request``). Text whose ids are not the tokenizer's own encoding of it
(a non-canonical tokenization: a model may sample `` hel`` + ``lo`` where the tokenizer writes `` hello``) comes
back as other ids, and SGLang's logprobs then belong to a prompt the trainer never sees.

So before sending, the server runs SGLang's own rebuild (the model's multimodal processor, as the tokenizer manager
calls it) on the request and compares the ids it gives back with the ids it holds. Any difference **refuses** the
request (``ImagePromptRebuildError``, nothing sent): SGLang 0.5.12 cannot be given these ids, and flagging a served
turn would still train a sample whose logprobs were computed on other tokens. verl_ext's loop ends the rollout
before that turn (its earlier turns are exact and kept, as when the budget runs out) and counts it
(``tito/engine/image_prompt_refused``).

The ban: a sampled image or video placeholder id has no image behind it and breaks the trainer's pairing of
placeholder runs with images (verl's vLLM server bans them; its SGLang server does not). The server bans them
with SGLang's own ``logit_bias`` (added to the logits before sampling and before the logprobs) on every request
to a multimodal model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.core.errors import EngineRequestError
from verl_ext.core.images import placeholder_runs

BANNED = float("-inf")  # a logit bias that makes an id impossible (SGLang adds it to the logits before softmax)


class ImagePromptRebuildError(EngineRequestError):
    """An image request SGLang 0.5.12 would serve on other prompt ids than the ones verl_ext holds (or could not
    serve at all); refused before it is sent (the message names the cause and what to do)."""


@dataclass(frozen=True)
class RebuildCheck:
    """SGLang's rebuild of one image prompt compared with the ids held: ``exact`` or the first difference."""

    exact: bool
    held: int  # len of the ids verl_ext holds
    rebuilt: int  # len of the ids SGLang's processor gave back
    first_difference: int | None
    detail: str  # the difference in words, or ""
    in_image: bool = False  # the first difference is in an image's placeholder run (its count), not in text


def placeholder_ids(mm_processor: Any) -> tuple[int, ...]:
    """The image and video placeholder ids of SGLang's multimodal processor (its ``mm_tokens``), the ids the
    policy must never sample."""
    tokens = getattr(mm_processor, "mm_tokens", None)
    found = (getattr(tokens, "image_token_id", None), getattr(tokens, "video_token_id", None))
    return tuple(sorted({int(i) for i in found if i is not None}))


def ban_placeholders(sampling_params: dict[str, Any], banned_ids: Sequence[int]) -> None:
    """Add the ban to ``sampling_params`` (in place) as SGLang's ``logit_bias`` (``{"id": bias}``), keeping any
    bias the caller set on other ids."""
    if not banned_ids:
        return
    bias = {str(k): float(v) for k, v in dict(sampling_params.get("logit_bias") or {}).items()}
    bias.update({str(int(i)): BANNED for i in banned_ids})
    sampling_params["logit_bias"] = bias


def check_images_match_runs(ids: Sequence[int], images: Sequence[Any], pad_id: int | None) -> None:
    """Refuse a request whose images are not one per placeholder run: SGLang pairs the k-th run with the k-th image
    and silently ignores images left over."""
    if pad_id is None:
        raise ImagePromptRebuildError(
            "verl_ext SGLang server: the request holds images, but SGLang's processor for this model names no image "
            "placeholder token; serve it with verl's own SGLang server (the audit preset) or a text prompt"
        )
    runs = placeholder_runs(ids, pad_id)
    if len(runs) != len(images):
        raise ImagePromptRebuildError(
            f"verl_ext SGLang server: the prompt holds {len(runs)} image placeholder run(s) (id {pad_id}) but "
            f"{len(images)} image(s) came with it: pass every image of the prompt, in placeholder order, one per "
            "run (SGLang pairs them in order and ignores images left over)"
        )


def compare_rebuild(
    held: Sequence[int], rebuilt: Sequence[int], decode: Any = None, placeholders: Sequence[int] = ()
) -> RebuildCheck:
    """Compare SGLang's rebuilt prompt ids with the ids held; ``decode`` (ids -> text) names the tokens that
    differ, ``placeholders`` (the image/video placeholder ids) tell a placeholder count from a text difference."""
    held, rebuilt = [int(i) for i in held], [int(i) for i in rebuilt]
    if held == rebuilt:
        return RebuildCheck(True, len(held), len(rebuilt), None, "")
    at = next((i for i, (a, b) in enumerate(zip(held, rebuilt, strict=False)) if a != b), min(len(held), len(rebuilt)))
    ours, theirs = held[at : at + 4], rebuilt[at : at + 4]

    def shown(ids: list[int]) -> str:
        return f"{ids}" + (f" {decode(ids)!r}" if decode is not None and ids else "")

    detail = (
        f"at position {at} the prompt holds {shown(ours)}, SGLang's rebuild from the decoded text has "
        f"{shown(theirs)} ({len(held)} ids held, {len(rebuilt)} rebuilt)"
    )
    in_image = any(ids and ids[0] in set(placeholders) for ids in (ours, theirs))
    return RebuildCheck(False, len(held), len(rebuilt), at, detail, in_image)


ROLLOUT_ENDS = (
    "The request is refused; verl_ext's loop ends the rollout before this turn (counted as "
    "tito/engine/image_prompt_refused)."
)


def refusal(request_id: str, check: RebuildCheck, consequence: str = ROLLOUT_ENDS) -> ImagePromptRebuildError:
    """The error for a prompt SGLang would rebuild to other ids: a placeholder count SGLang's processor expands
    otherwise, or a non-canonical tokenization; ``consequence`` says what the caller does with it."""
    if check.in_image:
        return ImagePromptRebuildError(
            f"verl_ext SGLang server: request {request_id}: SGLang's processor expands an image of this prompt to "
            f"another number of placeholder tokens than the prompt holds: {check.detail}. SGLang's image settings "
            "(the model folder's preprocessor_config.json and SGLang's mm_process_config) disagree with the "
            "processor verl_ext expanded the image with (verl's, with data.mm_processor_kwargs); make them the "
            f"same (the pixel limits above all: size shortest_edge/longest_edge, min_pixels/max_pixels). {consequence}"
        )
    return ImagePromptRebuildError(
        f"verl_ext SGLang server: request {request_id}: SGLang 0.5.12 rebuilds the prompt ids of a request with "
        f"images from their decoded text, and this prompt does not survive it: {check.detail}. The prompt holds a "
        "non-canonical tokenization (ids the tokenizer would not write for that text, usually a turn the model "
        f"sampled), so SGLang would compute the turn on other tokens than the trainer trains on. {consequence} To "
        "serve such rollouts token-exactly, use an engine that keeps the caller's ids with images (verl_ext_cpu, "
        "or vLLM), or keep SGLang and accept these rollouts being dropped; a SGLang that keeps ids with images "
        "(upstream #26555) needs a verl newer than 0.9.1."
    )


def not_rebuilt_by_legacy_path(server_args: Any) -> ImagePromptRebuildError | None:
    """SGLang re-collapses expanded placeholder runs only on its legacy path, which ``skip_tokenizer_init`` selects
    (verl's default); without it the HF processor is handed expanded runs and fails or expands them twice."""
    if getattr(server_args, "skip_tokenizer_init", True):
        return None
    return ImagePromptRebuildError(
        "verl_ext SGLang server: images need SGLang launched with skip_tokenizer_init=True (verl's default, "
        "actor_rollout_ref.rollout.skip_tokenizer_init=true): without it SGLang hands the prompt's expanded image "
        "placeholders to the processor as they are, which fails or expands them a second time"
    )


def collapse_runs(ids: Sequence[int], placeholders: Sequence[int]) -> list[int]:
    """``ids`` with each run of a placeholder id written once: the unexpanded form SGLang's processor expands on
    either of its paths (a caller that cannot know whether the server skips tokenizer init sends this)."""
    keep = set(int(i) for i in placeholders)
    out: list[int] = []
    for token in ids:
        token = int(token)
        if token in keep and out and out[-1] == token:
            continue
        out.append(token)
    return out


def image_list(image_data: Any) -> list[Any]:
    """verl passes the prompt's images as a list (one per placeholder run); a single image is a list of one."""
    if image_data is None:
        return []
    if isinstance(image_data, (list, tuple)):
        return list(image_data)
    return [image_data]
