"""The gloo checkpoint engine (verl_ext.engines.gloo_checkpoint) moving the real tiny Qwen3 model's weights from a
sender to rollout receivers, each rank in its own thread with its own event loop, through verl's own topology
contract (prepare -> build_topology -> init_process_group -> send/receive -> finalize). No Ray: the trainer e2e and
tests/engines/test_gloo_checkpoint_ray.py run it between Ray actors."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from verl_ext.core.errors import OptionsError
from verl_ext.engines import gloo_checkpoint
from verl_ext.engines.cpu import load_model, load_weights
from verl_ext.engines.gloo_checkpoint import GLOO_BACKEND, GlooCheckpointEngine

MB = 1 << 20


def perturbed_state(model: torch.nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """The model's state with noise added; tied names (one storage, e.g. embeddings and lm_head) get the same."""
    generator = torch.Generator().manual_seed(seed)
    by_storage: dict[int, torch.Tensor] = {}
    state = {}
    for name, tensor in model.state_dict().items():
        key = tensor.data_ptr()
        if key not in by_storage:
            by_storage[key] = tensor + 0.01 * torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype)
        state[name] = by_storage[key]
    return state


def in_threads(jobs: list[Callable[[], Any]]) -> list[Any]:
    """Run each job in its own thread (a rank each: their gloo calls block until the peers meet), return results."""
    results: list[Any] = [None] * len(jobs)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = jobs[i]()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return results


def sync(
    weights: list[tuple[str, torch.Tensor]],
    receivers: int,
    bucket_size: int,
    idle_senders: int = 0,
    timeout_s: float = 60,
) -> list[list[tuple[str, torch.Tensor]]]:
    """One sync as verl's CheckpointEngineManager drives it: actor ranks (rank 0 the master; ``idle_senders`` more
    that sit out) and ``receivers`` rollout workers; returns what each receiver got."""
    actors = [
        GlooCheckpointEngine(bucket_size, is_master=(i == 0), timeout_s=timeout_s) for i in range(1 + idle_senders)
    ]
    rollouts = [GlooCheckpointEngine(bucket_size, timeout_s=timeout_s) for _ in range(receivers)]
    metadata = [e.prepare() for e in actors] + [e.prepare() for e in rollouts]
    actor_kwargs, rollout_kwargs = GlooCheckpointEngine.build_topology(len(actors), len(rollouts), metadata)
    walked: list[int] = []

    def actor_job(i: int) -> Callable[[], Any]:
        def job() -> None:
            actors[i].init_process_group(**{k: v[i] for k, v in actor_kwargs.items()})

            def produced() -> Any:  # counts what each actor rank walked: every one must walk the generator
                for name, tensor in weights:
                    walked.append(i)
                    yield name, tensor

            asyncio.run(actors[i].send_weights(produced(), global_steps=1))
            actors[i].finalize()

        return job

    def rollout_job(i: int) -> Callable[[], Any]:
        def job() -> list[tuple[str, torch.Tensor]]:
            rollouts[i].init_process_group(**{k: v[i] for k, v in rollout_kwargs.items()})

            async def receive() -> list[tuple[str, torch.Tensor]]:
                return [(n, t.clone()) async for n, t in rollouts[i].receive_weights(global_steps=1)]

            got = asyncio.run(receive())
            rollouts[i].finalize()
            return got

        return job

    results = in_threads([actor_job(i) for i in range(len(actors))] + [rollout_job(i) for i in range(receivers)])
    assert sorted(set(walked)) == list(range(len(actors)))
    return results[len(actors) :]


@pytest.fixture(scope="module")
def model(tiny_qwen3_dir: Path) -> torch.nn.Module:
    return load_model(str(tiny_qwen3_dir))


@pytest.mark.timeout(300)
def test_every_receiver_loads_exactly_the_senders_weights(model: torch.nn.Module) -> None:
    """4 MiB buckets: the embedding (37 MiB) travels in chunks, the small tensors share buckets; two rollout
    workers and an actor rank that sits out. Each receiver's weights load into a fresh copy of the model (every
    parameter covered, no unknown name) and equal the sender's bit for bit."""
    sent = perturbed_state(model, seed=1)
    assert max(t.nbytes for t in sent.values()) > 2 * 4 * MB  # the chunked path is taken
    got = sync(list(sent.items()), receivers=2, bucket_size=4 * MB, idle_senders=1)
    for received in got:
        assert [n for n, _ in received] == list(sent)
        for name, tensor in received:
            assert tensor.dtype == sent[name].dtype and torch.equal(tensor, sent[name]), name
        assert load_weights(model, received) == len(sent)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, sent[name])


@pytest.mark.timeout(120)
def test_mixed_dtypes_and_odd_sizes_arrive_aligned() -> None:
    check_mixed_dtypes(timeout_s=60)


def check_mixed_dtypes(timeout_s: float) -> None:
    """Tensors whose byte sizes are not multiples of each other's element size (bf16 of odd length, int64, bool):
    every one is viewed back as its own dtype from the shared bucket."""
    weights = [
        ("a.bf16", torch.randn(7, dtype=torch.float32).to(torch.bfloat16)),
        ("b.i64", torch.arange(5, dtype=torch.int64)),
        ("c.bool", torch.tensor([True, False, True])),
        ("d.f32", torch.randn(3, 3)),
        ("e.empty", torch.empty(0)),
    ]
    (received,) = sync(weights, receivers=1, bucket_size=64, timeout_s=timeout_s)
    assert [n for n, _ in received] == [n for n, _ in weights]
    for (name, want), (_, have) in zip(weights, received, strict=True):
        assert have.dtype == want.dtype and torch.equal(have, want), name


def test_mutation_unaligned_offsets_are_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation: tensors packed back to back (no alignment): a bf16 tensor of odd length leaves the next tensor's
    bytes at an offset its dtype cannot be viewed at; the mixed-dtype test fails."""
    monkeypatch.setattr(gloo_checkpoint, "_ALIGN", 1)
    with pytest.raises(Exception):  # noqa: B017, PT011 - torch's view error or a value mismatch: either is caught
        check_mixed_dtypes(timeout_s=3)  # the receiver fails at the first bucket; the sender then times out


def test_mutation_a_lost_tensor_is_caught(model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation: a sender that loses the last tensor of the stream: the receiver's load refuses the partial sync
    (a parameter received nothing) and the comparison fails."""
    original = gloo_checkpoint.weight_chunks

    async def losing(weights: Any, bucket_size: int) -> Any:
        items = [item async for item in original(weights, bucket_size)]
        for item in items[:-1]:
            yield item

    monkeypatch.setattr(gloo_checkpoint, "weight_chunks", losing)
    with pytest.raises(AssertionError):
        test_every_receiver_loads_exactly_the_senders_weights(load_model_copy(model))


def load_model_copy(model: torch.nn.Module) -> torch.nn.Module:
    import copy

    return copy.deepcopy(model)


def test_refusals_name_the_problem() -> None:
    with pytest.raises(OptionsError, match="bucket_size must be at least"):
        GlooCheckpointEngine(8)
    with pytest.raises(OptionsError, match="actor rank 0 must be the master"):
        GlooCheckpointEngine.build_topology(1, 1, [{}, {}])
    engine = GlooCheckpointEngine(MB)
    with pytest.raises(OptionsError, match="before init_process_group"):
        asyncio.run(engine.send_weights(iter(())))
    assert GLOO_BACKEND == "verl_ext_gloo"
