"""A token trajectory whose prompts and tool results may hold images.

``ImageTrajectory`` is a ``TokenTrajectory`` that, wherever the template writes an image block (the first prompt,
a tool result, a user message), expands its placeholder exactly as the processor expands it (``ImageTokens``),
so the stream holds the ids the engine is given and the trainer trains on. It keeps the images in placeholder
order with each one's span (position, length, grid) and digest: what the check's image view compares and what
verl's trainer gets as ``multi_modal_data``. Image tokens are prompt or context tokens: never trained (mask 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from verl_ext.core.errors import TrajectoryError
from verl_ext.core.images import ImageTokens, image_digest, images_in
from verl_ext.core.prompt_ids import PromptIds
from verl_ext.core.rendering import Message
from verl_ext.core.trajectory import TokenKind, TokenTrajectory


@dataclass(frozen=True)
class ImageSpan:
    """One image in the stream: the ``index``-th image, its placeholder run at ``position`` (``length`` tokens,
    the count its ``grid`` implies), the ``digest`` of its pixels, the engine call (``turn``) it leads into."""

    index: int
    position: int
    length: int
    grid: tuple[int, ...]
    digest: str
    turn: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "position": self.position,
            "length": self.length,
            "grid": list(self.grid),
            "digest": self.digest,
            "turn": self.turn,
        }

    @classmethod
    def from_dict(cls, obj: Mapping[str, Any]) -> ImageSpan:
        return cls(
            int(obj["index"]),
            int(obj["position"]),
            int(obj["length"]),
            tuple(int(v) for v in obj["grid"]),
            str(obj["digest"]),
            int(obj["turn"]),
        )


class ImageTrajectory(TokenTrajectory):
    """``TokenTrajectory`` plus images: ``image_tokens`` (the probed profile and the processor) expands each image
    block the template renders. ``images`` and ``image_spans`` list them in placeholder order."""

    def __init__(self, *args: Any, image_tokens: ImageTokens, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.image_tokens = image_tokens
        self.images: list[Any] = []
        self.image_spans: list[ImageSpan] = []
        self._pending: list[Any] = []  # images of the messages being rendered, not yet expanded

    def start(self, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] | None = None) -> PromptIds:
        self._pending = images_in(messages)
        ids = super().start(messages, tools)
        self._all_expanded("the first prompt")
        return ids

    def append_messages(self, messages: Sequence[Message]) -> PromptIds:
        self._pending = images_in(messages)
        ids = super().append_messages(messages)
        self._all_expanded(f"the messages after turn {self.turn_index - 1}")
        return ids

    def multi_modal_data(self) -> dict[str, list[Any]] | None:
        """What verl's ``AgentLoopOutput.multi_modal_data`` holds: every image in placeholder order (None: none)."""
        return {"images": list(self.images)} if self.images else None

    def to_dict(self) -> dict[str, Any]:
        out = super().to_dict()
        out["images"] = [s.to_dict() for s in self.image_spans]
        return out

    # -- internals --------------------------------------------------------------------------------
    def _push(self, ids: Sequence[int], kind: TokenKind, turn: int, logprobs: Sequence[float] | None = None) -> None:
        placeholder = self.image_tokens.profile.placeholder_id
        if kind is not TokenKind.SAMPLED and placeholder in ids:
            ids = self._expanded(ids, turn)
        super()._push(ids, kind, turn, logprobs)

    def _expanded(self, ids: Sequence[int], turn: int) -> list[int]:
        """``ids`` with each placeholder run (one image block) replaced by the processor's expansion of the next
        pending image; each image's span recorded at its stream position."""
        placeholder = self.image_tokens.profile.placeholder_id
        out: list[int] = []
        k = 0
        while k < len(ids):
            if ids[k] != placeholder:
                out.append(ids[k])
                k += 1
                continue
            while k < len(ids) and ids[k] == placeholder:  # one run = one image block
                k += 1
            if not self._pending:
                raise TrajectoryError(
                    f"the template rendered more image placeholders than the messages hold images (turn {turn}): "
                    "an image part without an image, or placeholder text the template writes on its own"
                )
            image = self._pending.pop(0)
            expanded = self.image_tokens.expand(image)
            position = len(self._ids) + len(out)
            self.image_spans.append(
                ImageSpan(len(self.images), position, expanded.length, expanded.grid, image_digest(image), turn)
            )
            self.images.append(image)
            out += [placeholder] * expanded.length
        return out

    def _all_expanded(self, where: str) -> None:
        if self._pending:
            n, self._pending = len(self._pending), []
            raise TrajectoryError(
                f"{where} hold {n} image(s) the template rendered no placeholder for: the chat template drops "
                "image blocks of this role; use a VL template that renders them"
            )
