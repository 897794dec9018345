"""verl's async rollout path in process: verl's own ``FullyAsyncLLMServerClient`` over the CPU engine, with its global
load balancer's interface served in process (one server), and a weight update the way verl's ``colocate_async``
trainer does it (abort, update, resume) once the engine's TEST ONLY ``abort_after`` fault has parked a request."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class _Remote:
    """A Ray method's ``.remote(...)``, in process: the call's coroutine (awaitable as a Ray ObjectRef is)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn

    def remote(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)


class _ServerHandle:
    """The engine's actor handle as verl's client calls it (``server.generate.remote(...)``)."""

    def __init__(self, server: Any) -> None:
        self.generate = _Remote(server.generate)


class InProcessBalancer:
    """verl's global load balancer actor's interface (acquire/release, the declared fields) over one server."""

    def __init__(self, server: Any) -> None:
        handle = _ServerHandle(server)

        async def fields() -> list[str]:
            return []

        async def acquire(request_id: str, **_: Any) -> tuple[str, Any]:
            return "cpu-0", handle

        self.require_acquire_fields = _Remote(fields)
        self.require_release_fields = _Remote(fields)
        self.acquire_server = _Remote(acquire)
        self.release_server = _Remote(lambda **_: None)


def verl_async_client(config: Any, server: Any) -> Any:
    """The client verl's ``colocate_async`` trainer hands its agent loops (trainer_colocate_async.get_llm_client)."""
    from verl.workers.rollout.llm_server import FullyAsyncLLMServerClient

    return FullyAsyncLLMServerClient(config=config, load_balancer_handle=InProcessBalancer(server))


async def weight_update_when_parked(server: Any, version: int, parked: int = 1, timeout_s: float = 120.0) -> None:
    """verl's on_sample_end + on_step_end: once ``parked`` requests were parked by ``abort_after``, abort every
    request, load the weights of ``version`` (here: the version number only) and resume generation."""
    for _ in range(int(timeout_s / 0.01)):
        if server.fault_hits.get("abort_after", 0) >= parked:
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError(f"no request was parked within {timeout_s}s")
    await server.abort_all_requests()
    await server.set_global_steps(version)
    await server.resume_generation()
