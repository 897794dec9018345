"""The renderer as one check's rules read it, with ``decode`` memoized: the rules explaining the findings of a turn
decode the same short spans again and again (the turn's text up to each finding, the call's JSON, one token before a
span), about nine decodes of each distinct span on a rollout whose every turn draws findings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verl_ext.core.rendering import ChatRenderer

# Longer spans are decoded once by their readers already (cached there); hashing them here would cost, not save.
MEMO_MAX_IDS = 512


class MemoDecode:
    """``renderer`` with every other attribute as it is and ``decode`` answered from a per-check memo for spans of at
    most ``MEMO_MAX_IDS`` ids: the same text ``renderer.decode`` gives (decode is a pure function of the ids). Made
    per check and dropped with it, so the memo holds one rollout's spans at most."""

    def __init__(self, renderer: ChatRenderer) -> None:
        self.renderer = renderer
        self._texts: dict[tuple[int, ...], str] = {}

    def __getattr__(self, name: str) -> Any:
        # only called for what this class lacks: the renderer's own attributes, as the rules read them (never its own
        # fields or dunders: a copy or unpickling asks before ``__init__`` has set them)
        if name in ("renderer", "_texts") or name.startswith("__"):
            raise AttributeError(name)
        # kept on the memo for the check (rules read ``control_ids`` per finding): a renderer sets its fields once, in
        # ``__init__`` (``with_*`` make new ones), and the rest are its methods and cached properties
        value = getattr(self.renderer, name)
        setattr(self, name, value)
        return value

    def decode(self, ids: Sequence[int]) -> str:
        """``renderer.decode(ids)``, decoded once per distinct short span."""
        if len(ids) > MEMO_MAX_IDS:
            return self.renderer.decode(ids)
        key = tuple(ids)
        text = self._texts.get(key)
        if text is None:
            text = self._texts[key] = self.renderer.decode(key)
        return text
