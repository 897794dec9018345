"""The trajectory keeps one record per push; its per-token kinds, turns and logprobs are built from them when read,
and a turn's prompt digest is hashed from them when read. Both must read as the per-token lists filled eagerly
would, and the check must still see a stream changed after a prompt was handed out."""

from __future__ import annotations

import random

from rollouts import TOOLS, call, tool_result

from verl_ext.core.invariants import check_invariants
from verl_ext.core.trajectory import TokenKind, TokenTrajectory, prefix_digests, prompt_digest


def test_lazy_per_token_lists_equal_eager_ones_across_random_pushes(renderer_for):
    t = TokenTrajectory(renderer_for("qwen3"))
    rng = random.Random(10)
    ids: list[int] = []
    kinds: list[TokenKind] = []
    turns: list[int] = []
    logprobs: list[float] = []
    for _ in range(400):
        n = rng.choice([0, 1, 2, 7, 40])
        kind = rng.choice(list(TokenKind))
        turn = rng.randint(0, 50)
        pushed = [rng.randint(0, 150000) for _ in range(n)]
        lps = [-rng.random() for _ in range(n)] if kind is TokenKind.SAMPLED and rng.random() < 0.8 else None
        t._push(tuple(pushed) if rng.random() < 0.5 else pushed, kind, turn, lps)
        ids += pushed
        kinds += [kind] * n
        turns += [turn] * n
        logprobs += lps if lps is not None else [0.0] * n
        if rng.random() < 0.3:  # read between pushes: the cache must follow every later push
            assert t.kinds == kinds and t.turn_of == turns and t.logprobs == logprobs
            assert t.loss_mask == [1 if k is TokenKind.SAMPLED else 0 for k in kinds]
        assert t.input_ids == ids
        limit = rng.choice([None, 0, len(ids) // 2, len(ids) + 5])  # inside a push, none, past the end
        assert t.kind_values(limit) == [k.value for k in kinds][:limit]
    assert t.kinds == kinds and t.turn_of == turns and t.logprobs == logprobs
    assert t.loss_mask == [1 if k is TokenKind.SAMPLED else 0 for k in kinds]
    values = t.kind_values()
    assert values == [k.value for k in kinds] and all(type(v) is str for v in values)  # the record's plain strings


def _rollout(renderer, turns: int) -> TokenTrajectory:
    t = TokenTrajectory(renderer)
    t.start([{"role": "user", "content": "Add things up."}], TOOLS)
    close = renderer.tokenizer.convert_tokens_to_ids("<|im_end|>")
    for k in range(turns):
        message = {"role": "assistant", "content": "", "tool_calls": [call(f"{k}+2", k)]}
        text = f'<tool_call>\n{{"name": "calculator", "arguments": {{"expression": "{k}+2"}}}}\n</tool_call>'
        ids = renderer.encode(text) + ([close] if k % 3 else [])  # every third turn without its close: a repair
        t.add_sampled(ids, [-0.25] * len(ids), "stop", message=message)
        t.append_messages([tool_result(str(k + 2), k)])
    return t


def test_prompt_digests_read_from_the_records_equal_the_prompts_digests(renderer_for):
    t = _rollout(renderer_for("qwen3"), turns=9)
    t.finish()
    stream = list(t.input_ids)
    assert [turn.prompt_sha for turn in reversed(t.turns)] == [
        prompt_digest(stream[: turn.prompt_length]) for turn in reversed(t.turns)
    ]  # read last first: the digests are hashed in push order whatever the order they are read in
    lengths = [turn.prompt_length for turn in t.turns]
    assert prefix_digests(stream, lengths) == {n: prompt_digest(stream[:n]) for n in lengths}
    assert check_invariants(t).ok


def test_the_check_sees_a_stream_changed_after_its_prompt_was_handed_out(renderer_for):
    t = _rollout(renderer_for("qwen3"), turns=4)
    p = t.turns[2].prompt_length
    t._ids[p - 1] += 1  # inside turn 2's prompt, after that prompt went to the engine (no public way to do this)
    failures = check_invariants(t).failures
    assert "turn 2: the prompt sent to the engine is not a prefix of the stream" in failures
    assert "turn 3: the prompt sent to the engine is not a prefix of the stream" in failures
    assert not any(f.startswith(("turn 0", "turn 1")) for f in failures)


def test_the_stream_holds_plain_ints_and_a_changed_id_is_caught(renderer_for):
    """The stream is packed: a bool (which passes an isinstance(int) test) written into it is kept as its int, so an
    engine call copies plain ints; the changed id is still caught, by the prompt digests."""
    t = _rollout(renderer_for("qwen3"), turns=2)
    assert t.input_ids[3] != 1
    t._ids[3] = True
    assert type(t.input_ids[3]) is int and t.input_ids[3] == 1
    assert check_invariants(t).failures == tuple(
        f"turn {k}: the prompt sent to the engine is not a prefix of the stream" for k in range(len(t.turns))
    )
