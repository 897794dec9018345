"""PromptIds: the read-only prompt view a trajectory hands back each turn (no copy of the stream per turn)."""

from __future__ import annotations

import operator
import pickle
import random

import pytest
from rollouts import TOOLS, call, tool_result

from verl_ext.check.inputs import EngineCall
from verl_ext.core.invariants import check_invariants
from verl_ext.core.prompt_ids import PromptIds
from verl_ext.core.trajectory import TokenTrajectory


def test_a_view_reads_as_the_list_prefix_it_shows():
    ids = [5, 6, 7, 8, 9]
    view = PromptIds(ids, 4)
    prefix = ids[:4]
    assert len(view) == 4 and list(view) == prefix and view[:] == prefix
    assert view[:] is not ids and type(view[:]) is list  # a slice is a new list: the copy a consumer needs
    assert [view[i] for i in range(-4, 4)] == [prefix[i] for i in range(-4, 4)]
    slices = [
        slice(a, b, c)
        for a in (None, -9, -2, 0, 1, 3, 9)
        for b in (None, -9, -1, 0, 2, 4, 9)
        for c in (None, 1, 2, -1, -3)
    ]
    for s in slices:
        assert view[s] == prefix[s], s
    for bad in (4, -5, 100):
        with pytest.raises(IndexError):
            view[bad]
    assert 7 in view and 9 not in view  # 9 is past the view's end
    assert view.index(7) == 2 and view.count(5) == 1
    assert list(reversed(view)) == prefix[::-1]
    assert PromptIds(ids) == ids and len(PromptIds([])) == 0
    with pytest.raises(ValueError):
        PromptIds(ids, 6)


def test_a_view_equals_lists_and_views_with_the_same_ids():
    ids = [1, 2, 3, 4]
    view = PromptIds(ids, 3)
    assert view == [1, 2, 3] and operator.eq([1, 2, 3], view)  # the list on the left too (Python reflects it)
    assert view != [1, 2, 3, 4] and view != [1, 2] and view != [1, 2, 4]
    assert view == PromptIds([1, 2, 3]) and view == PromptIds(ids, 3) and view != PromptIds(ids, 4)
    assert view != (1, 2, 3)  # as a list compares with a tuple
    assert view + [9] == [1, 2, 3, 9] and [0] + view == [0, 1, 2, 3] and view + view == [1, 2, 3] * 2
    assert type(view + [9]) is list and type([0] + view) is list and ids == [1, 2, 3, 4]
    with pytest.raises(TypeError):
        view + (9,)  # as a list refuses a tuple
    with pytest.raises(TypeError):
        hash(view)  # equal to a list, which is unhashable


def test_a_view_cannot_be_changed():
    ids = [1, 2, 3]
    view = PromptIds(ids)
    with pytest.raises(TypeError):
        view[0] = 9  # type: ignore[index]
    with pytest.raises(TypeError):
        del view[0]  # type: ignore[attr-defined]
    for name in ("append", "extend", "insert", "pop", "clear", "sort", "reverse", "remove"):
        assert not hasattr(view, name), name
    with pytest.raises(AttributeError):
        view.extra = 1  # type: ignore[attr-defined]
    copy = view[:]
    copy.append(4)
    assert ids == [1, 2, 3] and view == [1, 2, 3]


def test_a_view_pickles_as_its_own_ids():
    ids = list(range(1000))
    restored = pickle.loads(pickle.dumps(PromptIds(ids, 3)))
    assert isinstance(restored, PromptIds) and restored == [0, 1, 2]
    assert len(pickle.dumps(PromptIds(ids, 3))) < 100  # not the owner's 1,000 ids


def _tool_rollout(renderer, turns: int) -> tuple[TokenTrajectory, list[PromptIds], list[list[int]]]:
    """A Qwen3 tool rollout: the prompt views as handed back, and a list copy of each taken at the time."""
    t = TokenTrajectory(renderer)
    prompt = t.start([{"role": "user", "content": "Add things up."}], TOOLS)
    views, copies = [prompt], [list(prompt)]
    rng = random.Random(7)
    for k in range(turns):
        message = {"role": "assistant", "content": "", "tool_calls": [call(f"{k}+2", k)]}
        text = f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{k}+2"}}}}\n</tool_call>'
        ids = [*renderer.encode(text), renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")]
        t.add_sampled(ids, [-0.5] * len(ids), "stop", message=message)
        result = " ".join(str(rng.randint(0, 999)) for _ in range(rng.randint(1, 40)))
        prompt = t.append_messages([tool_result(result, k)])
        views.append(prompt)
        copies.append(list(prompt))
    return t, views, copies


def test_every_prompt_handed_back_stays_the_snapshot_it_was(renderer_for):
    t, views, copies = _tool_rollout(renderer_for("qwen3"), turns=12)
    t.finish()
    for view, copy in zip(views, copies, strict=True):  # later turns and the close appended, nothing changed
        assert isinstance(view, PromptIds) and view == copy
    for turn, view in zip(t.turns, views, strict=False):  # each turn's prompt is the view handed back before it
        assert turn.prompt_length == len(view) and t.input_ids[: len(view)] == view[:]
    assert check_invariants(t).ok


def test_the_stream_is_read_only_from_outside(renderer_for):
    t, _, _ = _tool_rollout(renderer_for("qwen3"), turns=2)
    with pytest.raises(TypeError):
        t.input_ids[0] = 1  # type: ignore[index]
    with pytest.raises(AttributeError):
        t.input_ids.append(1)  # type: ignore[attr-defined]
    with pytest.raises(AttributeError):
        t.input_ids = []  # type: ignore[misc]


def test_an_engine_call_copies_a_view_as_plain_ints(renderer_for):
    t, views, _ = _tool_rollout(renderer_for("qwen3"), turns=3)
    call = EngineCall.of(views[2], [1, 2], [-0.1, -0.2])
    assert call.prompt_ids == tuple(views[2]) and {type(i) for i in call.prompt_ids} == {int}
    assert call == EngineCall.of(list(views[2]), [1, 2], [-0.1, -0.2])
