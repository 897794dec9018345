"""A checkpoint engine for verl 0.9.1 that works without an accelerator: trainer weights to separate rollout servers
over gloo (torch.distributed on TCP), backend name ``verl_ext_gloo``.

verl's trainers with a rollout pool apart from the trainer's (``one_step_off_policy``, ``fully_async_policy``, the
v1 trainer's ``separate_async``) move weights through a checkpoint engine chosen by name
(``actor_rollout_ref.rollout.checkpoint_engine.backend``). The shipped non-colocated ones need CUDA or RDMA: ``nccl``
imports cupy and allocates its buckets with ``torch.zeros(..., device="cuda")``, ``hccl`` is Ascend's, ``nixl``,
``mooncake`` and ``kimi`` need their transport libraries. This one has the same shape as ``nccl`` (actor rank 0
broadcasts buckets of raw bytes to every rollout worker; the other actor ranks only walk the weight generator, which
is collective over the trainer's group), with gloo for the bytes and the group's TCP store for each bucket's table.
Select it with::

    actor_rollout_ref.rollout.checkpoint_engine.backend=verl_ext_gloo
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=verl_ext.engines.gloo_checkpoint

(verl imports ``custom_backend_module`` in the trainer workers and the rollout workers before it builds the engine;
importing this module registers the backend). The group is built per sync and torn down in ``finalize``, as
verl's manager calls ``prepare`` / ``init_process_group`` / ``finalize`` around every update: a fresh TCP store on an
OS-chosen port each time, so no state outlives a sync.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import pickle
import time
from collections.abc import AsyncIterator, Iterable
from typing import Any

import torch
import torch.distributed as dist
from verl.checkpoint_engine.base import (
    CheckpointEngine,
    CheckpointEngineRegistry,
    TensorMeta,
    merge_weight_chunks,
    split_weight_chunks,
)
from verl.workers.rollout.utils import ensure_async_iterator

from verl_ext.core.errors import OptionsError

logger = logging.getLogger(__name__)

GLOO_BACKEND = "verl_ext_gloo"
MODULE = __name__  # what ``checkpoint_engine.custom_backend_module`` names
_ALIGN = 16  # each tensor's bytes start on a 16-byte boundary: a uint8 slice viewed as any dtype must be aligned
_KEY = "verl_ext_gloo/bucket/{}"  # the store key of bucket i's table (names, shapes, dtypes, offsets)


def plain_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """A detached, contiguous CPU tensor with the same values (a DTensor is gathered first)."""
    if hasattr(tensor, "full_tensor"):  # an FSDP2 DTensor
        tensor = tensor.full_tensor()
    return tensor.detach().to("cpu").contiguous()


def _aligned(offset: int) -> int:
    return -(-offset // _ALIGN) * _ALIGN


@CheckpointEngineRegistry.register(GLOO_BACKEND)
class GlooCheckpointEngine(CheckpointEngine):
    """Actor rank 0 (``is_master``) broadcasts the weights, bucket by bucket, to every rollout worker over gloo.

    ``bucket_size``: bytes per broadcast (verl passes ``update_weights_bucket_megabytes << 20``); a tensor larger than
    a bucket travels in chunks and is merged on arrival. ``timeout_s``: how long a rank waits for its peers (store
    connect, rendezvous, each bucket); set through ``checkpoint_engine.engine_kwargs.verl_ext_gloo.timeout_s``.
    """

    def __init__(self, bucket_size: int, is_master: bool = False, timeout_s: float = 600.0) -> None:
        if bucket_size < _ALIGN:
            raise OptionsError(f"{GLOO_BACKEND}: bucket_size must be at least {_ALIGN} bytes, got {bucket_size}")
        self.bucket_size = int(bucket_size)
        self.is_master = is_master
        self.timeout = datetime.timedelta(seconds=float(timeout_s))
        self.rank: int | None = None
        self.world_size: int | None = None
        self._store: Any = None
        self._group: Any = None
        self.last_sync: dict[str, float] = {}  # bytes, tensors, seconds of this rank's last send or receive

    # ---- group set-up, per sync --------------------------------------------------------------------------------

    def prepare(self) -> dict[str, Any]:
        """The master opens the group's TCP store on a free port and reports where it is; other ranks report
        nothing."""
        if not self.is_master:
            return {}
        host = _node_ip()
        self._store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False, timeout=self.timeout)
        return {"host": host, "port": int(self._store.port)}

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list[dict[str, Any]]
    ) -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
        """Actor rank 0 is rank 0 of the group, the rollout workers ranks 1..n; the other actor ranks sit out (-1)."""
        master = metadata[0]
        if "port" not in master:
            raise OptionsError(f"{GLOO_BACKEND}: actor rank 0 must be the master (is_master=True); got {master!r}")
        world_size = 1 + rollout_world_size
        actor = {
            "rank": [0] + [-1] * (actor_wg_world_size - 1),
            "world_size": [world_size] * actor_wg_world_size,
            "host": [master["host"]] * actor_wg_world_size,
            "port": [master["port"]] * actor_wg_world_size,
        }
        rollout = {
            "rank": list(range(1, world_size)),
            "world_size": [world_size] * rollout_world_size,
            "host": [master["host"]] * rollout_world_size,
            "port": [master["port"]] * rollout_world_size,
        }
        return actor, rollout

    def init_process_group(self, rank: int, world_size: int, host: str, port: int) -> None:
        """Join the group (blocks until every rank has joined); a rank of -1 sits this sync out."""
        self.rank, self.world_size = rank, world_size
        if rank < 0:
            return
        if rank > 0:
            self._store = dist.TCPStore(host, port, is_master=False, timeout=self.timeout)
        elif self._store is None:
            raise OptionsError(f"{GLOO_BACKEND}: rank 0 joined without prepare() (the master opens the store)")
        self._group = dist.ProcessGroupGloo(self._store, rank, world_size, self.timeout)

    def finalize(self) -> None:
        """Drop the group and the store (the next sync builds new ones)."""
        self._group = None
        self._store = None
        self.rank = None
        self.world_size = None

    # ---- the transfer -----------------------------------------------------------------------------------------

    async def send_weights(self, weights: Iterable[tuple[str, torch.Tensor]], global_steps: int | None = None) -> None:
        """Rank 0: broadcast every weight; a rank sitting out (-1) walks the generator (producing a full tensor is
        collective over the trainer's ranks) and sends nothing."""
        if self.rank is None:
            raise OptionsError(f"{GLOO_BACKEND}: send_weights before init_process_group")
        if self.rank < 0:
            async for _ in ensure_async_iterator(weights):
                pass
            return None
        if self.rank != 0:
            raise OptionsError(f"{GLOO_BACKEND}: only actor rank 0 sends weights (this is rank {self.rank})")
        started, sent, tensors = time.monotonic(), 0, 0
        buffer = torch.empty(self.bucket_size, dtype=torch.uint8)
        table: dict[str, TensorMeta] = {}
        offset, index = 0, 0
        async for meta, chunk in weight_chunks(weights, self.bucket_size):
            start = _aligned(offset)
            if table and start + meta.chunk_size > self.bucket_size:
                await self._broadcast(index, buffer, table, offset, last=False)
                sent, index, table, offset, start = sent + offset, index + 1, {}, 0, 0
            meta.offset = start
            table[meta.name] = meta
            buffer[start : start + meta.chunk_size] = chunk
            offset = start + meta.chunk_size
            tensors += meta.chunk_offset == 0
        await self._broadcast(index, buffer, table, offset, last=True)
        self.last_sync = {"bytes": sent + offset, "tensors": tensors, "seconds": time.monotonic() - started}
        logger.info("%s: sent %d tensors, %d bytes in %d buckets", GLOO_BACKEND, tensors, sent + offset, index + 1)
        return None

    async def _broadcast(
        self, index: int, buffer: torch.Tensor, table: dict[str, TensorMeta], length: int, last: bool
    ) -> None:
        """Publish bucket ``index``'s table in the store, then broadcast its bytes (blocking calls off the loop)."""
        header = pickle.dumps({"bucket_meta": table, "is_last": last, "length": length})
        await asyncio.to_thread(self._store.set, _KEY.format(index), header)
        if length:
            await asyncio.to_thread(self._broadcast_into, buffer[:length])

    def _broadcast_into(self, tensor: torch.Tensor) -> None:
        """One gloo broadcast from rank 0 (rank 0 sends ``tensor``, the others fill it); blocks until done."""
        self._group.broadcast(tensor, 0).wait()

    async def receive_weights(self, global_steps: int | None = None) -> AsyncIterator[tuple[str, torch.Tensor]]:
        """A rollout worker: every weight rank 0 sends, as ``(name, tensor)`` on CPU (chunked tensors merged)."""
        if self.rank is None or self.rank <= 0:
            raise OptionsError(f"{GLOO_BACKEND}: only rollout workers (rank >= 1) receive, this is rank {self.rank}")
        async for name, weight in merge_weight_chunks(self._receive_chunks(), self.bucket_size):
            yield name, weight

    async def _receive_chunks(self) -> AsyncIterator[tuple[TensorMeta, torch.Tensor]]:
        started, received, tensors, index = time.monotonic(), 0, 0, 0
        while True:
            raw = await asyncio.to_thread(self._store.get, _KEY.format(index))
            header = pickle.loads(raw)
            # a fresh buffer per bucket: the tensors yielded are views of it and stay valid after the next bucket
            buffer = torch.empty(header["length"], dtype=torch.uint8)
            if header["length"]:
                await asyncio.to_thread(self._broadcast_into, buffer)
            for meta in header["bucket_meta"].values():
                tensors += meta.chunk_offset == 0
                yield meta, buffer[meta.offset : meta.offset + meta.chunk_size]
            received += header["length"]
            if header["is_last"]:
                break
            index += 1
        self.last_sync = {"bytes": received, "tensors": tensors, "seconds": time.monotonic() - started}


async def weight_chunks(
    weights: Iterable[tuple[str, torch.Tensor]], bucket_size: int
) -> AsyncIterator[tuple[TensorMeta, torch.Tensor]]:
    """Each weight as verl's chunks (``split_weight_chunks``: at most ``bucket_size`` bytes each), and a tensor with
    no elements as one empty chunk: verl's splitter yields nothing for it, and the receiver's load would then miss a
    parameter."""
    async for name, tensor in ensure_async_iterator(weights):
        tensor = plain_tensor(tensor)
        if tensor.nbytes == 0:
            yield TensorMeta(name, tensor.shape, tensor.dtype, 0, 0, None), tensor.view(-1).view(torch.uint8)
            continue
        async for item in split_weight_chunks([(name, tensor)], bucket_size):
            yield item


def _node_ip() -> str:
    """This node's address as Ray knows it (peers on other nodes connect to it); 127.0.0.1 outside Ray."""
    import ray

    if ray.is_initialized():
        return ray.util.get_node_ip_address().strip("[]")
    return "127.0.0.1"
