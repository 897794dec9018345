"""Which engine turns of a session's branches a trainer trains (verl_ext.gateway.training), on the real Qwen3
tokenizer and the CPU engine: with ``branches: all`` each engine-sampled token is trained in exactly one branch (a
fork's replayed turns are masked out of its parent), each branch's record says what it trains, and a plan that
does not mask is caught by ``trained_count``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gateway_fixtures import CALL
from test_session import THINK_ANSWER, ask, first_turn, reply

from verl_ext.core.trajectory import TokenKind
from verl_ext.gateway.training import BranchTraining, plan_training, trained_count, trained_mask
from verl_ext.telemetry.records import read_records


def forked_session(make_gateway: Any) -> Any:
    """Branch 0: a calculator call, the tool's 42, an answer. Branch 1 forks at the tool's result (41): it replays
    branch 0's call and samples its own answer. Returns the gateway and the session's branches."""
    gateway = make_gateway([CALL % "6*7", THINK_ANSWER % (42, 42)])
    messages, done = first_turn(gateway)
    ask(gateway, "s", reply(messages, done.message, "42"))
    edited = ask(gateway, "s", reply(messages, done.message, "41"))
    assert edited.fork is not None and edited.fork.replayed_turns == 1
    return gateway, gateway.sessions["s"].branches


def samples(results: Any) -> list[tuple[Any, Any, Any]]:
    return [(r.rollout.calls, r.trajectory, r.trained_mask) for r in results if r.trained_tokens]


def test_all_trains_a_forks_replayed_turn_once_in_the_fork(make_gateway: Any, tmp_path: Path) -> None:
    gateway, (parent, child) = forked_session(make_gateway)
    assert child.calls[0] is parent.calls[0] and child.calls[1] is not parent.calls[1]
    plan = plan_training(gateway.sessions["s"].branches, "all")
    assert plan == {0: BranchTraining((1,), ((0, 1),)), 1: BranchTraining((0, 1))}
    first, second = gateway.end("s", training=plan)
    assert all(r.result.ok and r.result.engine_ok for r in (first, second))  # checked as the branches are
    # the parent keeps the shared turn in its stream (context) but trains only its own answer
    shared = len(parent.calls[0].output_ids)
    own = len(parent.calls[1].output_ids)
    assert (shared, own) == (21, 19)  # the figures docs/gateway.md quotes
    assert sum(first.rollout.sample.response_mask) == shared + own and first.trained_tokens == own
    assert second.trained_tokens == sum(second.rollout.sample.response_mask) == shared + len(child.calls[1].output_ids)
    start = len(first.rollout.sample.prompt_ids)
    turn_of, kinds = first.trajectory.turn_of, first.trajectory.kinds
    for i, (checked, trained) in enumerate(zip(first.rollout.sample.response_mask, first.trained_mask, strict=True)):
        assert trained == (checked if turn_of[start + i] == 1 else 0)
        assert not trained or kinds[start + i] is TokenKind.SAMPLED
    counts = trained_count(samples([first, second]))
    assert len(counts) == shared + own + len(child.calls[1].output_ids) and set(counts.values()) == {1}
    # each record says what its branch trains (verl-ext report reads it)
    _, records = read_records(sorted((tmp_path / "records").iterdir()))
    trains = [r.extra["gateway"]["trains"] for r in records]
    assert trains == [
        {"turns": [1], "tokens": own, "elsewhere": [{"turn": 0, "branch": 1}]},
        {"turns": [0, 1], "tokens": second.trained_tokens},
    ]


def test_a_plan_that_does_not_mask_is_caught_by_the_count(make_gateway: Any) -> None:
    # the mutation: every branch trains every turn it holds (the replayed turn is not masked out of the parent)
    gateway, branches = forked_session(make_gateway)
    results = gateway.end("s", training=plan_training(branches, "all"))
    unmasked = [
        (r.rollout.calls, r.trajectory, trained_mask(r.trajectory, r.rollout.sample, range(len(r.rollout.calls))))
        for r in results
    ]
    counts = trained_count(unmasked)
    twice = [key for key, n in counts.items() if n == 2]
    assert len(twice) == len(branches[0].calls[0].output_ids)  # the replayed call's tokens, once per branch
    assert {key[0] for key in twice} == {id(branches[0].calls[0])}
    assert set(trained_count(samples(results)).values()) == {1}  # the plan's masks: once each


def test_last_trains_the_last_branch_and_an_untrainable_last_branch_nothing(make_gateway: Any) -> None:
    gateway, branches = forked_session(make_gateway)
    refused = plan_training(branches, "all", {1: "its prompt is too long"})
    assert refused[1] == BranchTraining((), (), "its prompt is too long")
    assert refused[0].turns == () and "last branch (1)" in (refused[0].untrained or "")
    plan = plan_training(branches, "last")
    assert plan[0] == BranchTraining((), untrained="branches=last trains the session's last branch (1)")
    first, second = gateway.end("s", training=plan)
    assert first.trained_tokens == 0 and second.trained_mask == second.rollout.sample.response_mask
    assert set(trained_count(samples([first, second])).values()) == {1}


def test_a_retried_request_is_a_sample_of_its_own(make_gateway: Any) -> None:
    # the same prompt sent again: a second engine call with the same ids (teacher-forced) is still a second sample
    gateway = make_gateway([CALL % "6*7"])
    messages, _ = first_turn(gateway)
    assert ask(gateway, "s", messages).fork is not None
    first, second = gateway.sessions["s"].branches
    assert first.calls[0] == second.calls[0] and first.calls[0] is not second.calls[0]
    plan = plan_training(gateway.sessions["s"].branches, "all")
    assert plan == {0: BranchTraining((0,)), 1: BranchTraining((0,))}


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="branches must be one of last, all, got 'first'"):
        plan_training([], "first")
    assert plan_training([], "all") == {}
