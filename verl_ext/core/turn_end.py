"""How an engine call ended, judged from its ids: shared by every loop that calls an engine (the verl agent loops
and the gateway), so they agree on what a stop, a length cut and a turn's message body are."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from verl_ext.core.errors import OptionsError
from verl_ext.core.template_profile import TemplateProfile
from verl_ext.core.trajectory import FinishReason


def judge_finish(
    ids: Sequence[int], max_tokens: int, stop_ids: Sequence[int], profile: TemplateProfile
) -> FinishReason:
    """From the ids, not the engine's label: vLLM reports "completed" for both a stop and the length limit."""
    if ids and (ids[-1] in profile.stop_id_set or ids[-1] in stop_ids):
        return FinishReason.STOP
    return FinishReason.LENGTH if len(ids) >= max_tokens else FinishReason.STOP


def end_of_turn_ids(profile: TemplateProfile) -> frozenset[int]:
    """Stop ids that end a turn (template closes, eos and its aliases): not message content. A stop id only the
    user configured (e.g. </tool_call>) is part of the text a tool parser needs."""
    return frozenset(s.id for s in profile.stop_ids if set(s.sources) - {"user"})


def message_body(ids: Sequence[int], end_ids: frozenset[int]) -> Sequence[int]:
    """A turn's ids without its end-of-turn stop: what a tool parser reads."""
    return ids[:-1] if ids and ids[-1] in end_ids else ids


def stop_text_id(encode: Callable[[str], Sequence[int]], text: str, where: str) -> int:
    """The one token id a stop text names (``encode`` without special tokens added: the renderer's or the
    tokenizer's). Raises ``OptionsError`` naming ``where`` (the option or field that gave it), the text and its ids
    when it is not exactly one token: an engine stops on single ids, and a stop string would cut its ids mid-token."""
    ids = [int(i) for i in encode(text)]
    if len(ids) != 1:
        raise OptionsError(
            f"{where} {text!r} is {len(ids)} tokens {ids}; an engine stops on a single token (a stop string "
            "would cut the engine's ids mid-token): pass one token"
        )
    return ids[0]
