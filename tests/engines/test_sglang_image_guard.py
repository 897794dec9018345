"""The SGLang server's image guard without SGLang (verl_ext/engines/sglang_images.py), and how verl_ext's loop counts
a refusal (verl_ext/plugin/engine_turn.py). SGLang's own rebuild is exercised in test_sglang_server_images.py."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from verl_ext.core.images import placeholder_runs
from verl_ext.engines.sglang_images import (
    BANNED,
    ImagePromptRebuildError,
    ban_placeholders,
    check_images_match_runs,
    compare_rebuild,
    refusal,
)
from verl_ext.plugin.engine_turn import generate_turn

PAD = 151655


def test_placeholder_runs_one_per_image() -> None:
    ids = [1, PAD, PAD, PAD, PAD, 2, 3, PAD, PAD, 4, PAD]
    assert placeholder_runs(ids, PAD) == [(1, 4), (7, 2), (10, 1)]
    check_images_match_runs(ids, ["a", "b", "c"], PAD)
    with pytest.raises(ImagePromptRebuildError, match=r"3 image placeholder run\(s\) .* but 2 image"):
        check_images_match_runs(ids, ["a", "b"], PAD)


def test_compare_rebuild_names_the_first_difference_and_its_kind() -> None:
    assert compare_rebuild([1, 2, 3], [1, 2, 3]).exact
    text = compare_rebuild([1, 11338, 385, 9], [1, 23811, 9], decode=lambda ids: f"<{len(ids)}>")
    assert (text.exact, text.first_difference, text.in_image) == (False, 1, False)
    assert "[11338, 385, 9] '<3>'" in text.detail and "3 rebuilt" in text.detail
    assert "non-canonical" in str(refusal("r1", text))
    count = compare_rebuild([1, PAD, PAD, 2], [1, PAD, 2], placeholders=[PAD])
    assert (count.first_difference, count.in_image) == (2, True)
    assert "another number of placeholder tokens" in str(refusal("r1", count))
    shorter = compare_rebuild([1, 2, 3], [1, 2])
    assert shorter.first_difference == 2 and not shorter.exact


def test_the_ban_keeps_the_callers_bias() -> None:
    params: dict[str, Any] = {"logit_bias": {7: 1.5}}
    ban_placeholders(params, [PAD, PAD + 1])
    assert params["logit_bias"] == {"7": 1.5, str(PAD): BANNED, str(PAD + 1): BANNED}
    untouched: dict[str, Any] = {}
    ban_placeholders(untouched, [])
    assert untouched == {}


class RayLikeError(Exception):
    """What a Ray actor's error arrives as: the server's exception in ``cause``."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(f"ray: {cause}\nTraceback ...")
        self.cause = cause


@pytest.mark.parametrize("wrapped", [False, True], ids=["in-process", "through-ray"])
def test_a_refused_image_prompt_is_counted_and_raised_as_the_servers_error(wrapped: bool) -> None:
    """engine_turn counts it and hands the loop the server's own error (unwrapped from Ray's), which ends the
    rollout before the turn (tests/images/test_vl_loop.py)."""
    refused = ImagePromptRebuildError("request r: ... non-canonical tokenization ...")

    class Server:
        async def generate(self, **kw: Any) -> Any:
            raise RayLikeError(refused) if wrapped else refused

    counters: Counter[str] = Counter()
    with pytest.raises(ImagePromptRebuildError, match="non-canonical tokenization") as info:
        asyncio.run(generate_turn(Server(), "r", [1, PAD, 2], {}, 8, counters, image_data=["img"]))
    assert info.value is refused
    assert counters == Counter({"engine/image_prompt_refused": 1})


def test_other_engine_errors_are_not_counted_as_refusals() -> None:
    class Server:
        async def generate(self, **kw: Any) -> Any:
            raise ValueError("something else")

    counters: Counter[str] = Counter()
    with pytest.raises(ValueError, match="something else"):
        asyncio.run(generate_turn(Server(), "r", [1], {}, 8, counters))
    assert counters == Counter()
