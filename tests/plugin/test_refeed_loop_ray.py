"""The re-feed audit through verl's real server client: two CPU engine servers as Ray actors behind verl's
``GlobalRequestLoadBalancer`` and ``LLMServerClient``; each rollout is re-scored on the server that sampled it."""

from __future__ import annotations

import json

import pytest
from loop_harness import run_loop

from verl_ext.plugin import metrics_sink

pytestmark = pytest.mark.xdist_group("ray")  # the Ray group: tests/conftest.py

PROMPTS = [[{"role": "user", "content": f"What is {a} * 7?"}] for a in (2, 3, 4, 5)]


@pytest.fixture
def ray_local():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.mark.timeout(300)
def test_each_rollout_is_rescored_on_the_server_verl_routed_it_to(make_loop, tmp_path, tiny_qwen3_dir, ray_local):
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.router import GlobalRequestLoadBalancer

    from verl_ext.engines.cpu import CPUGenerationServer

    ray = ray_local
    server_cls = ray.remote(num_cpus=0)(CPUGenerationServer)
    shifted = [{"kind": "score_shift", "shift": -0.5}]
    servers = {
        "clean": server_cls.remote(str(tiny_qwen3_dir), prompt_length=512, response_length=32),
        "lying": server_cls.remote(str(tiny_qwen3_dir), prompt_length=512, response_length=32, faults=shifted),
    }

    class RoutingBalancer(GlobalRequestLoadBalancer):  # verl's own balancer, with where it routed each request id
        def routed(self) -> dict[str, str]:
            return dict(self._request_id_to_server)

    balancer = ray.remote(num_cpus=0)(RoutingBalancer).remote(servers)
    metrics_sink.drain()
    options = {"records": {"dir": str(tmp_path)}, "numerics": {"refeed_fraction": 1.0}}
    loop, _ = make_loop(verl_ext=options, extra=["actor_rollout_ref.rollout.name=verl_ext_cpu"], response_length=32)
    loop.server_manager = LLMServerClient(loop.config, balancer)
    for prompt in PROMPTS:
        run_loop(loop, prompt, global_steps=1)
    m = metrics_sink.drain()
    lines = [json.loads(x) for f in tmp_path.glob("*.jsonl") for x in f.read_text().splitlines()]
    numerics = [x for x in lines if x["type"] == "numerics"]
    # verl picks among idle servers at random: whichever served a rollout re-scored it, the lying one is refused
    routed = list(ray.get(balancer.routed.remote()).values())
    assert len(routed) == len(PROMPTS)  # one sticky request id per rollout, every turn and its re-score on it
    assert m.get("tito/numerics/refeed_audited", 0) == routed.count("clean") == len(numerics)
    assert m.get("tito/numerics/refeed_refused", 0) == routed.count("lying")
    assert all(x["numerics"]["overall"]["max_abs"] <= 1e-4 for x in numerics)
