"""Two sides of a finding that print alike: both shown with their ids and tokens, never as two equal strings."""

from __future__ import annotations

from collections.abc import Sequence

from verl_ext.core.rendering import ChatRenderer

_MAX_IDS = 12


def alike_note(renderer: ChatRenderer, s_ids: Sequence[int], r_ids: Sequence[int], s_text: str, r_text: str) -> str:
    """ "" unless the two sides print alike and differ in ids; then both sides' ids and tokens, to append to a
    finding's detail."""
    if repr(s_text) != repr(r_text) or tuple(s_ids) == tuple(r_ids):
        return ""

    def side(ids: Sequence[int]) -> str:
        shown = list(ids[:_MAX_IDS])
        tokens = renderer.tokenizer.convert_ids_to_tokens(shown)
        more = f" +{len(ids) - _MAX_IDS}" if len(ids) > _MAX_IDS else ""
        return f"ids {shown}{more} (tokens {tokens})"

    return f"; the two texts print alike ({s_text!r}): stream {side(s_ids)}, template {side(r_ids)}"
