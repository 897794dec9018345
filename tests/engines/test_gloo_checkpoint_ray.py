"""The gloo checkpoint engine between Ray actors, driven by verl's own ``CheckpointEngineManager``: a trainer-side
worker (a verl ``Worker`` holding the real tiny Qwen3, its weights changed as an update would) sends, verl's
``CheckpointEngineWorker`` in the CPU engine's standalone replica (``CPURolloutReplica.init_standalone``, the
separate rollout pool of one_step_off_policy and fully_async_policy) receives and loads the weights into the
``CPUGenerationServer``, which then scores as the trainer's model does. The trainer side stands in for verl's FSDP
actor only in where the weights come from (its ``update_weights`` walks a state dict into ``send_weights`` as the
actor walks ``get_per_tensor_param``); the trainer e2e in docs/async.md runs the FSDP actor."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register

pytestmark = [pytest.mark.xdist_group("ray"), pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[2]
IDS = [151644, 872, 198, 3838, 374, 220, 16, 17, 9, 22, 30, 151645, 198, 151644, 77091, 198]  # a Qwen3 chat prompt


class TrainerSide(Worker):
    """A trainer-side verl worker: the model after an "update" (noise of ``scale`` added) and the checkpoint engine
    verl's actor builds (``is_master`` on rank 0), with the two methods verl's manager calls on the actor group."""

    def __init__(self, model_path: str, scale: float, bucket_megabytes: int) -> None:
        import torch

        from verl_ext.engines.cpu import load_model
        from verl_ext.engines.gloo_checkpoint import GlooCheckpointEngine

        super().__init__()
        self.model = load_model(model_path)
        generator = torch.Generator().manual_seed(7)
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(scale * torch.randn(p.shape, generator=generator))
        self.engine = GlooCheckpointEngine(bucket_megabytes << 20, is_master=self.rank == 0)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def update_weights(self, global_steps: int | None = None, mode: str = "auto") -> None:
        await self.engine.send_weights(self.model.state_dict().items(), global_steps=global_steps)

    @register(dispatch_mode=Dispatch.DP_COMPUTE, blocking=False)
    def execute_checkpoint_engine(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.engine, method)(*args, **kwargs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def scores(self, ids: list[int], start: int) -> list[float]:
        from verl_ext.engines.cpu import score_tokens

        return score_tokens(self.model, ids, start)


def rollout_config(model_path: str) -> Any:
    """verl's ppo_trainer.yaml composed with the CPU engine and the gloo checkpoint engine (8 MiB buckets: the
    embedding travels in chunks)."""
    import verl.trainer
    from hydra import compose, initialize_config_dir

    from verl_ext.engines.gloo_checkpoint import GLOO_BACKEND, MODULE

    overrides = [
        f"actor_rollout_ref.model.path={model_path}",
        "actor_rollout_ref.rollout.name=verl_ext_cpu",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.checkpoint_engine.backend={GLOO_BACKEND}",
        f"actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module={MODULE}",
        "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=8",
        "actor_rollout_ref.rollout.prompt_length=64",
        "actor_rollout_ref.rollout.response_length=8",
    ]
    with initialize_config_dir(config_dir=str(Path(verl.trainer.__file__).parent / "config"), version_base=None):
        return compose(config_name="ppo_trainer", overrides=overrides).actor_rollout_ref


async def sync_once(model_path: str, scale: float, global_steps: int) -> dict[str, Any]:
    """One weight sync as a trainer with a separate rollout pool runs it; what the server then serves."""
    import ray
    from verl.checkpoint_engine import CheckpointEngineManager
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.utils.config import omega_conf_to_dataclass
    from verl.workers.config import HFModelConfig

    from verl_ext.engines.cpu import CPURolloutReplica, server_name

    cfg = rollout_config(model_path)
    rollout = cfg.rollout
    model_config = omega_conf_to_dataclass(cfg.model, dataclass_type=HFModelConfig)
    replica = CPURolloutReplica(replica_rank=0, config=rollout, model_config=model_config, gpus_per_node=1)
    await replica.init_standalone()
    pool = RayResourcePool([1], use_gpu=True, name_prefix="gloo_trainer", max_colocate_count=1)
    trainer = RayWorkerGroup(
        resource_pool=pool,
        ray_cls_with_init=RayClassWithInitArgs(ray.remote(TrainerSide), model_path, scale, 8),
        device_name="cpu",
    )
    manager = CheckpointEngineManager(
        config=omega_conf_to_dataclass(rollout.checkpoint_engine), actor_wg=trainer, replicas=[replica]
    )
    await manager.update_weights(global_steps=global_steps)
    server = ray.get_actor(server_name(0))
    served = await server.score.remote(IDS, 4)
    (trained,) = trainer.scores(IDS, 4)
    return {"stats": await server.stats.remote(), "served": served, "trained": trained}


@pytest.fixture(scope="module")
def ray_cpu() -> Any:
    import ray

    env = {"VERL_PLATFORM": "cpu", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    ray.init(
        num_cpus=4,
        num_gpus=2,  # fake: verl's pools ask for GPUs; the CPU platform maps them to this resource
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": env},
    )
    try:
        yield ray
    finally:
        ray.shutdown()


def test_the_rollout_server_serves_the_trainers_weights_after_a_sync(ray_cpu: Any, tiny_qwen3_dir: Path) -> None:
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the test module is not importable in Ray's workers

    # the driver runs in a Ray task: there VERL_PLATFORM=cpu is set before verl is imported, as in a trainer
    @ray.remote(num_cpus=0)
    def driver(scale: float, steps: int) -> dict[str, Any]:
        import asyncio

        return asyncio.run(sync_once(str(tiny_qwen3_dir), scale, steps))

    result = ray.get(driver.remote(0.05, 3), timeout=300)
    assert result["stats"]["weight_syncs"] == 1 and result["stats"]["global_steps"] == 3
    served, trained = result["served"], result["trained"]
    assert served["global_steps"] == 3
    # the server scores with the trainer's weights: float32 rounding apart, not the random model it loaded
    assert max(abs(a - b) for a, b in zip(served["logprobs"], trained, strict=True)) < 1e-5
    from verl_ext.engines.cpu import load_model, score_tokens

    untouched = score_tokens(load_model(str(tiny_qwen3_dir)), IDS, 4)
    assert max(abs(a - b) for a, b in zip(untouched, trained, strict=True)) > 1e-3  # the update changed the scores
