"""``verl_ext_gateway_agent``: verl rollouts driven by a harness verl_ext did not write, through the gateway.

Each agent-loop worker process starts one gateway server (on a free port, in the worker's own event loop, the first
time a rollout runs); its engine is verl's rollout server (``generate_turn``, as ``verl_ext_tool_agent`` calls it),
with verl's sampling parameters. For each row the loop opens a session, runs the harness against the session's base
URL and, when the harness is done, ends the session: each branch is checked and recorded as one rollout, and the
last branch is the row's training sample. The harness is a Python callable (``module:function``, async or sync,
called with ``base_url``, ``api_key`` and ``row``) or a command line run with ``OPENAI_BASE_URL`` and
``OPENAI_API_KEY`` set (and the row as JSON in ``VERL_EXT_ROW``), named by ``verl_ext.harness`` (the ``gateway``
preset) with the ``harness`` key of the loop's entry over it (``HarnessOptions``; the driver's preflight checks it).
Its result goes to ``extra_fields["harness_result"]`` (the callable's return value, or the command's last stdout
line, parsed as JSON where it parses). A harness that raises, runs past its timeout or exits non-zero ends the
rollout with the reason in its record and ``tito/gateway/harness_failed``; its sample has a loss mask of zeros, so
nothing of it is trained.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import logging
import os
import socket
from collections import Counter
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

from verl_ext.check.inputs import EngineCall
from verl_ext.gateway.conclude import BranchResult
from verl_ext.gateway.engine import Sampled, Sampling
from verl_ext.gateway.parsing import ToolCallReader, reasoning_markers
from verl_ext.gateway.service import Gateway, GatewayConfig
from verl_ext.plugin import metrics_sink
from verl_ext.plugin.agent_loop import VerlExtToolAgentLoop, _plain_index, merge_engine_extra_fields, training_step
from verl_ext.plugin.engine_turn import generate_turn
from verl_ext.plugin.harness_options import HarnessOptions, resolve_function
from verl_ext.telemetry.records import RecordWriter

log = logging.getLogger("verl_ext.plugin")

AGENT_NAME = "verl_ext_gateway_agent"
# The session a gateway request serves, set for the request's task (_SessionGateway.complete): the engine files each
# call's extra fields under it, so the trained branch hands verl its calls' fields (v1 tags each sample with the
# weight versions that served it: min/max_global_steps).
_SESSION: ContextVar[str | None] = ContextVar("verl_ext_gateway_session", default=None)
CallKey = tuple[tuple[int, ...], tuple[int, ...]]  # (prompt ids, output ids) of one engine call


class ServerManagerEngine:
    """The gateway's engine over verl's rollout server: the sampling parameters verl gave the session's row (a
    validation row's are not a training row's), one whole turn per call."""

    max_context: int | None = None

    def __init__(self, server_manager: Any, sampling_params: Mapping[str, Any]) -> None:
        self.server_manager = server_manager
        self.sampling_params = dict(sampling_params)
        self.counters: Counter[str] = Counter()
        self.extra_fields: dict[str, dict[CallKey, dict[str, Any]]] = {}  # session -> call -> verl's extra fields
        # session -> its row's sampling parameters (a validation row's differ from a training row's)
        self.session_params: dict[str, dict[str, Any]] = {}

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling) -> Sampled:
        """One turn with verl's rollout sampling parameters (a harness's temperature does not change the policy's
        sampling), the gateway's budget and stop ids."""
        params = dict(self.session_params.get(_SESSION.get() or "", self.sampling_params))
        stops = set(params.get("stop_token_ids") or ()) | set(sampling.stop_ids)
        if stops:
            params["stop_token_ids"] = sorted(stops)
        out = await generate_turn(
            self.server_manager, uuid4().hex, prompt_ids, params, sampling.max_tokens, self.counters
        )
        sampled = Sampled(tuple(int(i) for i in out.token_ids), None if out.log_probs is None else tuple(out.log_probs))
        session = _SESSION.get()
        if session is not None:
            key = (tuple(int(i) for i in prompt_ids), sampled.token_ids)
            self.extra_fields.setdefault(session, {})[key] = dict(out.extra_fields)
        return sampled

    def served_version(self, session: str) -> Any:
        """The weight version (verl's ``global_steps``) that served the session's first call; None before any."""
        filed = self.extra_fields.get(session) or {}
        return next(iter(filed.values()), {}).get("global_steps")

    def take_extra_fields(self, session: str, calls: Sequence[EngineCall]) -> tuple[dict[str, Any], int]:
        """verl's extra fields of ``calls`` merged as verl's tool_agent merges turns' (the first call's, the latest
        max_global_steps), and how many calls have none filed; forgets the session's calls."""
        filed = self.extra_fields.pop(session, {})
        merged: dict[str, Any] = {}
        missing = 0
        for call in calls:
            fields = filed.get((call.prompt_ids, call.output_ids))
            if fields is None:
                missing += 1
            else:
                merge_engine_extra_fields(merged, fields)
        return merged, missing


class _RowRecords:
    """The worker gateway's record writer: a branch's record gets its row's training step, data source and index (the
    gateway knows only the session), as verl_ext_tool_agent's records have, so the report groups them by step."""

    def __init__(self) -> None:
        self.writer: RecordWriter | None = None
        self.rows: dict[str, dict[str, Any]] = {}  # session -> {"step", "data_source", "index"}

    @property
    def path(self) -> Any:
        return None if self.writer is None else self.writer.path

    def write(self, record: Any) -> None:
        if self.writer is None:
            return
        session = (getattr(record, "extra", None) or {}).get("gateway", {}).get("session")
        row = self.rows.get(str(session))
        if row is not None:
            extra = {**record.extra, "data_source": row["data_source"], "index": row["index"]}
            record = dataclasses.replace(record, step=row["step"], extra=extra)
        self.writer.write(record)


class _SessionGateway(Gateway):
    """The worker's gateway: every engine call of a request runs with ``_SESSION`` set to the request's session."""

    async def complete(self, session_id: str, request: Any) -> Any:
        token = _SESSION.set(session_id)
        try:
            return await super().complete(session_id, request)
        finally:
            _SESSION.reset(token)


@dataclass
class _WorkerGateway:
    gateway: Gateway
    engine: ServerManagerEngine
    url: str
    server: Any
    records: _RowRecords


# event loop id -> the start of its gateway (one per worker process in practice); a task, so the rollouts a worker
# starts together await one start instead of each starting a server
_WORKERS: dict[int, asyncio.Task[_WorkerGateway]] = {}


class VerlExtGatewayAgentLoop(VerlExtToolAgentLoop):
    """Registered as ``verl_ext_gateway_agent`` (module docstring); the harness comes from ``verl_ext.harness`` with
    the ``harness`` key of the loop's entry over it (``HarnessOptions``), verl_ext's other options as for the
    built-in loop."""

    def __init__(self, *args: Any, harness: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.harness = HarnessOptions.from_mapping(
            harness, base=self.options.harness, where=f"{AGENT_NAME} harness"
        ).required()

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        """One row: open a session, run the harness, end the session, return the last branch as the sample."""
        worker = await self._worker(sampling_params)
        session_id = uuid4().hex
        worker.records.rows[session_id] = {
            "step": training_step(kwargs, None),
            "data_source": kwargs.get("data_source"),
            "index": _plain_index(kwargs.get("index")),
        }
        worker.engine.session_params[session_id] = dict(sampling_params)
        try:
            worker.gateway.open(session_id)
            base_url = f"{worker.url}/sessions/{session_id}/v1"
            result, failure = await run_harness(self.harness, base_url, session_id, kwargs)
            # v0 passes no step: it is the weight version that served the session + 1, as for the built-in loop
            worker.records.rows[session_id]["step"] = training_step(kwargs, worker.engine.served_version(session_id))
            session = worker.gateway.sessions[session_id]
            async with session.lock:
                results = worker.gateway.end(session_id, failure or "the harness finished")
        finally:
            del worker.records.rows[session_id]
            del worker.engine.session_params[session_id]
        counters: Counter[str] = Counter()  # tito/loop/<name>: counted by the loop routing, once per rollout
        counters["gateway/forks"] = sum(1 for r in results if "fork" in r.rollout.extra["gateway"])
        counters["gateway/branches"] = len(results)
        counters.update(worker.engine.counters)
        worker.engine.counters.clear()
        trained_calls = results[-1].rollout.calls if results else ()
        engine_fields, missing = worker.engine.take_extra_fields(session_id, trained_calls)
        if missing:  # never expected: each call the gateway made ran under its session
            counters["gateway/engine_fields_missing"] += missing
        engine_fields = _with_weight_versions(engine_fields, kwargs)
        if failure is not None or not results:
            counters["gateway/harness_failed" if failure else "gateway/no_engine_call"] += 1
            metrics_sink.count(counters)
            why = failure or "the harness made no chat-completions call"
            return self._untrained(kwargs, why, result, engine_fields)
        chosen = results[-1]
        prompt_length = len(chosen.rollout.sample.prompt_ids)
        if prompt_length > self.prompt_length:
            # verl would cut the prompt to rollout.prompt_length: the trainer would see other tokens than the engine
            counters["gateway/prompt_over_length"] += 1
            metrics_sink.report(chosen.result, counters)
            why = (
                f"the harness's first prompt renders to {prompt_length} tokens, more than rollout.prompt_length="
                f"{self.prompt_length}; raise data.max_prompt_length (and rollout.prompt_length)"
            )
            return self._untrained(kwargs, why, result, engine_fields)
        metrics_sink.report(chosen.result, counters)
        for other in results[:-1]:
            metrics_sink.report(other.result, {})
        self.rt.enforcer.enforce(chosen.result, training_step(kwargs, engine_fields.get("global_steps")))
        return self._output(chosen, result, engine_fields)

    async def _worker(self, sampling_params: Mapping[str, Any]) -> _WorkerGateway:
        loop = asyncio.get_running_loop()
        start = _WORKERS.get(id(loop))
        if start is None or (start.done() and (start.cancelled() or start.exception() is not None)):  # tried again
            start = _WORKERS[id(loop)] = loop.create_task(self._start_worker(sampling_params))
        worker = await asyncio.shield(start)  # a cancelled rollout does not cancel the start the others await
        # Loop instances of one worker share these in a run; set them per rollout all the same (they are this
        # instance's: its server manager, check, records and limits; the sampling parameters are per session).
        worker.engine.server_manager = self.server_manager
        worker.gateway.checker, worker.records.writer = self.rt.checker, self.rt.writer
        worker.gateway.config.response_length = self.response_length
        worker.gateway.config.max_branches = self.harness.max_branches
        return worker

    async def _start_worker(self, sampling_params: Mapping[str, Any]) -> _WorkerGateway:
        import uvicorn

        from verl_ext.gateway.server import KEEP_ALIVE_S, create_app

        engine = ServerManagerEngine(self.server_manager, sampling_params)
        records = _RowRecords()
        config = GatewayConfig(
            response_length=self.response_length, max_branches=self.harness.max_branches, open_on_demand=False
        )
        reader = ToolCallReader(self.tokenizer, self.config.actor_rollout_ref.rollout.multi_turn.format or "hermes")
        gateway = _SessionGateway(
            engine,
            self.rt.renderer,
            self.rt.profile,
            reader,
            config,
            checker=self.rt.checker,
            writer=records,
            markers=reasoning_markers(self.tokenizer),
        )
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(
            uvicorn.Config(
                create_app(gateway, "policy"), log_level="warning", lifespan="off", timeout_keep_alive=KEEP_ALIVE_S
            )
        )
        server.install_signal_handlers = lambda: None  # type: ignore[method-assign]  # the worker owns its signals
        asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        while not server.started:
            await asyncio.sleep(0.01)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        log.info("%s: gateway serving on %s (pid %d)", AGENT_NAME, url, os.getpid())
        return _WorkerGateway(gateway, engine, url, server, records)

    def _output(self, chosen: BranchResult, harness_result: Any, engine_fields: Mapping[str, Any]) -> AgentLoopOutput:
        sample = chosen.rollout.sample
        return AgentLoopOutput(
            prompt_ids=list(sample.prompt_ids),
            response_ids=list(sample.response_ids),
            response_mask=list(sample.response_mask),
            response_logprobs=list(sample.response_logprobs) if sample.response_logprobs is not None else None,
            num_turns=1 + 2 * len(chosen.rollout.calls),
            metrics=AgentLoopMetrics(),
            extra_fields={
                **engine_fields,
                "verl_ext_check": chosen.result.verdict_fields(),
                "harness_result": harness_result,
                "verl_ext_gateway": dict(chosen.rollout.extra["gateway"]),
                "turn_scores": [],
                "tool_rewards": [],
            },
        )

    def _untrained(
        self, kwargs: Mapping[str, Any], why: str, harness_result: Any, engine_fields: Mapping[str, Any]
    ) -> AgentLoopOutput:
        """A rollout whose harness failed: the row's prompt and one end-of-turn token, all masked out."""
        from verl_ext.core.trajectory import TokenTrajectory

        log.warning("%s: %s; the rollout is not trained", AGENT_NAME, why)
        prompt = TokenTrajectory(self.rt.renderer, self.rt.profile).start(list(kwargs["raw_prompt"]))
        end = self.rt.profile.stop_ids[0].id
        return AgentLoopOutput(
            prompt_ids=list(prompt),
            response_ids=[end],
            response_mask=[0],
            response_logprobs=[0.0],
            num_turns=1,
            metrics=AgentLoopMetrics(),
            extra_fields={
                **engine_fields,
                "harness_result": harness_result,
                "verl_ext_gateway": {"failed": why},
                "turn_scores": [],
            },
        )


def _with_weight_versions(fields: dict[str, Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """verl's v1 trainer reads min/max_global_steps of every sample (the weight versions that served it); a row whose
    harness made no call has none, so it gets the trainer's step (its one token is masked: no weights served it)."""
    if fields.get("min_global_steps") is None and kwargs.get("global_steps") is not None:
        step = int(kwargs["global_steps"])
        fields = {**fields, "min_global_steps": step, "max_global_steps": fields.get("max_global_steps") or step}
    return fields


async def run_harness(
    options: HarnessOptions, base_url: str, api_key: str, row: Mapping[str, Any]
) -> tuple[Any, str | None]:
    """Run the harness against one session; returns (its result, None) or (None, why it failed)."""
    try:
        if options.function is not None:
            return await asyncio.wait_for(_call(options.function, base_url, api_key, row), options.timeout_s), None
        return await _command(options.command or "", base_url, api_key, row, options.timeout_s)
    except TimeoutError:
        return None, f"the harness ran past its timeout of {options.timeout_s:g} s"
    except Exception as exc:  # the harness is user code: its failure ends this rollout, not the step
        return None, f"the harness raised {type(exc).__name__}: {exc}"


async def _call(target: str, base_url: str, api_key: str, row: Mapping[str, Any]) -> Any:
    function = resolve_function(target)
    if inspect.iscoroutinefunction(function):
        return await function(base_url=base_url, api_key=api_key, row=row)
    return await asyncio.to_thread(function, base_url=base_url, api_key=api_key, row=row)


async def _command(
    command: str, base_url: str, api_key: str, row: Mapping[str, Any], timeout_s: float
) -> tuple[Any, str | None]:
    env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": api_key}
    env["VERL_EXT_ROW"] = json.dumps(dict(row), default=str)
    process = await asyncio.create_subprocess_shell(
        command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    if process.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["(no stderr)"]
        return None, f"the harness command exited with status {process.returncode}: {tail[0]}"
    lines = out.decode(errors="replace").strip().splitlines()
    if not lines:
        return None, None
    try:
        return json.loads(lines[-1]), None
    except json.JSONDecodeError:
        return lines[-1], None
