"""``verl_ext_gateway_agent``: verl rollouts driven by a harness verl_ext did not write, through the gateway.

Each agent-loop worker process starts one gateway server (on a free port, in the worker's own event loop, the first
time a rollout runs); its engine is verl's rollout server (``generate_turn``, as ``verl_ext_tool_agent`` calls it),
with verl's sampling parameters. For each row the loop opens a session, runs the harness against the session's base
URL and, when the harness is done, ends the session: each branch is checked and recorded as one rollout. With
``branches: last`` the last branch is the row's training sample; with ``branches: all`` (verl's v1 trainer) every
branch with a turn of its own is one, each engine turn trained in the last branch holding it (a fork's replayed turns
are masked out of its parent's sample: verl_ext.gateway.training), and the row's samples go to verl as a list (the
last one last: v1 gives every sample of a session the last one's reward and GRPO advantage). The harness is a Python
callable (``module:function``, async or sync, called with ``base_url``, ``api_key`` and ``row``) or a command line
run with ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` set (and the row as JSON in ``VERL_EXT_ROW``), named by
``verl_ext.harness`` (the ``gateway`` preset) with the ``harness`` key of the loop's entry over it
(``HarnessOptions``; the driver's preflight checks it). Its result goes to ``extra_fields["harness_result"]`` (the
callable's return value, or the command's last stdout line, parsed as JSON where it parses). A harness that raises,
runs past its timeout or exits non-zero ends the rollout with the reason in its record and
``tito/gateway/harness_failed``; its sample has a loss mask of zeros, so nothing of it is trained. Images: the
gateway's image side is probed from verl's processor (``worker_vision``; none: an image is a 400 naming the cause),
each engine call passes every image of the prompt as ``image_data``, and each sample carries ``multi_modal_data``
(the images its placeholder runs hold, the list the record's image evidence was computed from).
"""

from __future__ import annotations

import asyncio
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

from verl.experimental.agent_loop.agent_loop import AgentLoopOutput

from verl_ext.check.inputs import EngineCall
from verl_ext.core.bounded_cache import LruCache
from verl_ext.core.errors import OptionsError, TemplateError
from verl_ext.core.images import ImageTokens, has_images
from verl_ext.core.rendering import ChatRenderer
from verl_ext.gateway.conclude import BranchResult
from verl_ext.gateway.engine import Sampled, Sampling
from verl_ext.gateway.parsing import ToolCallReader, reasoning_markers
from verl_ext.gateway.service import Gateway, GatewayConfig
from verl_ext.gateway.training import plan_training, trained_count
from verl_ext.plugin import metrics_sink
from verl_ext.plugin.agent_loop import VerlExtToolAgentLoop, merge_engine_extra_fields, plain_index, training_step
from verl_ext.plugin.engine_turn import generate_turn
from verl_ext.plugin.harness_options import (
    V0_TRAINER_REFUSED,
    HarnessOptions,
    branches_all_refusal,
    resolve_function,
)
from verl_ext.plugin.image_loop import vision_for
from verl_ext.plugin.loop_output import loop_output, untrained_output

log = logging.getLogger("verl_ext.plugin")

AGENT_NAME = "verl_ext_gateway_agent"
# The session a gateway request serves, set for the request's task (_SessionGateway.complete): the engine files each
# call's extra fields under it, so the trained branch hands verl its calls' fields (v1 tags each sample with the
# weight versions that served it: min/max_global_steps).
_SESSION: ContextVar[str | None] = ContextVar("verl_ext_gateway_session", default=None)
CallKey = tuple[tuple[int, ...], tuple[int, ...]]  # (prompt ids, output ids) of one engine call


def _refuse_row_images_without_vision(gateway: Any, raw_prompt: Sequence[Any]) -> None:
    """A row whose prompt holds images, for a gateway without an image side, is refused as verl_ext_tool_agent
    refuses it: never a row's images dropped (the untrained sample renders the prompt)."""
    if gateway.vision is None and has_images(list(raw_prompt)):
        raise OptionsError(
            f"{AGENT_NAME}: the row's prompt holds images, but {gateway.no_images}; serve a "
            "vision-language model, or remove the images from the data"
        )


class ServerManagerEngine:
    """The gateway's engine over verl's rollout server: the sampling parameters verl gave the session's row (a
    validation row's are not a training row's), one whole turn per call, every image of the prompt with it."""

    max_context: int | None = None
    takes_images = True  # verl's server API takes image_data; whether the model has an image side is the processor's

    def __init__(self, server_manager: Any, sampling_params: Mapping[str, Any]) -> None:
        self.server_manager = server_manager
        self.sampling_params = dict(sampling_params)
        self.counters: Counter[str] = Counter()
        self.extra_fields: dict[str, dict[CallKey, dict[str, Any]]] = {}  # session -> call -> verl's extra fields
        # session -> its row's sampling parameters (a validation row's differ from a training row's)
        self.session_params: dict[str, dict[str, Any]] = {}

    async def generate(self, prompt_ids: Sequence[int], sampling: Sampling, images: Sequence[Any] = ()) -> Sampled:
        """One turn with verl's rollout sampling parameters (a harness's temperature does not change the policy's
        sampling), the gateway's budget and stop ids; ``images``: every image of the prompt in placeholder order,
        passed as verl's ``image_data`` (as verl_ext_tool_agent passes them); the result's ``images`` is that list,
        for the engine call's record."""
        params = dict(self.session_params.get(_SESSION.get() or "", self.sampling_params))
        stops = set(params.get("stop_token_ids") or ()) | set(sampling.stop_ids)
        if stops:
            params["stop_token_ids"] = sorted(stops)
        out = await generate_turn(
            self.server_manager,
            uuid4().hex,
            prompt_ids,
            params,
            sampling.max_tokens,
            self.counters,
            image_data=list(images) or None,
        )
        sampled = Sampled(
            tuple(int(i) for i in out.token_ids),
            None if out.log_probs is None else tuple(out.log_probs),
            None if out.images is None else tuple(out.images),  # the image_data verl's server manager was given
            tuple(out.segments),  # one per engine call: two or more for a turn resumed after a weight update
            (out.extra_fields or {}).get("global_steps"),  # the weight label (the record's trainer entry)
        )
        session = _SESSION.get()
        if session is not None:
            key = (len(prompt_ids), sampled.token_ids)  # a call's prompt length and output name it in its session
            self.extra_fields.setdefault(session, {})[key] = dict(out.extra_fields)
        return sampled

    def decided_sampling(self, session: str) -> dict[str, Any]:
        """The settings the session's row samples with, whatever a harness asks (``Engine.decided_sampling``): verl's
        rollout temperature, top_p and top_k (the policy trains on what it samples at those); no seed is passed."""
        params = self.session_params.get(session, self.sampling_params)
        return {"temperature": params.get("temperature"), "top_p": params.get("top_p"), "top_k": params.get("top_k")}

    def served_version(self, session: str) -> Any:
        """The weight version (verl's ``global_steps``) that served the session's first call; None before any."""
        filed = self.extra_fields.get(session) or {}
        return next(iter(filed.values()), {}).get("global_steps")

    def take_extra_fields(
        self, session: str, samples: Sequence[Sequence[EngineCall]]
    ) -> tuple[list[dict[str, Any]], int]:
        """For each sample's calls, verl's extra fields of them merged as verl's tool_agent merges turns' (the first
        call's, the latest max_global_steps), and how many calls have none filed; forgets the session's calls."""
        filed = self.extra_fields.pop(session, {})
        out: list[dict[str, Any]] = []
        missing = 0
        for calls in samples:
            merged: dict[str, Any] = {}
            for call in calls:
                fields = filed.get((call.prompt_length, call.output_ids))
                if fields is None:
                    missing += 1
                else:
                    merge_engine_extra_fields(merged, fields)
            out.append(merged)
        return out, missing


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
    vision_of: tuple[Any, str] | None = None  # (verl's processor, template fingerprint) the gateway's image side is of


def worker_vision(processor: Any, renderer: ChatRenderer) -> tuple[ImageTokens | None, str]:
    """The image side of the worker's gateway: the probed profile of verl's processor with the loop's template
    (``vision_for``, as verl_ext_tool_agent probes it), or None and why the gateway answers an image with a 400."""
    if processor is None:
        return None, (
            f"verl gives {AGENT_NAME} no processor (a text-only model, or a VL processor verl could not build: "
            "verl's hf_processor returns None without torchvision)"
        )
    try:
        vision = vision_for(processor, renderer)
    except TemplateError as exc:
        return None, f"the model's processor and chat template cannot serve images: {exc}"
    if vision is None:
        return None, f"verl's processor ({type(processor).__name__}) has no image processor"
    return vision, ""


# event loop id -> the start of its gateway (one per worker process in practice); a task, so the rollouts a worker
# starts together await one start instead of each starting a server. Bounded: a process runs a handful of event loops
# at most (tests run one each); an evicted loop's gateway keeps serving its rollouts, a new one starts if it asks again.
_WORKERS: LruCache[int, asyncio.Task[_WorkerGateway]] = LruCache("gateway agent loop workers", 8)


class VerlExtGatewayAgentLoop(VerlExtToolAgentLoop):
    """Registered as ``verl_ext_gateway_agent`` (module docstring); the harness comes from ``verl_ext.harness`` with
    the ``harness`` key of the loop's entry over it (``HarnessOptions``), verl_ext's other options as for the
    built-in loop."""

    loop_name = AGENT_NAME

    def __init__(self, *args: Any, harness: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.harness = HarnessOptions.from_mapping(
            harness, base=self.options.harness, where=f"{AGENT_NAME} harness"
        ).required()
        refusal = branches_all_refusal(self.config) if self.harness.branches == "all" else None
        if refusal is not None:  # the driver's preflight says so first; an entry point without it gets it here
            raise OptionsError(refusal)

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        """One row: open a session, run the harness, end the session, return its training samples (the last branch;
        with ``branches: all`` a list, one per branch with a turn of its own)."""
        every_branch = self.harness.branches == "all"
        if every_branch and "session_id" not in kwargs:
            # verl 0.9.1's v1 worker passes each rollout its session_id and takes a list; a worker that passes none
            # (v0's AgentLoopWorker) takes one output per row
            raise OptionsError(f"{V0_TRAINER_REFUSED} (this rollout's worker passed no session_id: not v1's)")
        worker = await self._worker(sampling_params)
        _refuse_row_images_without_vision(worker.gateway, kwargs["raw_prompt"])
        session_id = uuid4().hex
        worker.engine.session_params[session_id] = dict(sampling_params)
        try:
            session = worker.gateway.open(session_id)
            # each branch's record names the row it served, as verl_ext_tool_agent's records do
            row = {"data_source": kwargs.get("data_source"), "index": plain_index(kwargs.get("index"))}
            session.row.update(step=training_step(kwargs, None), trainer=self.trainer_mode, **row)
            base_url = f"{worker.url}/sessions/{session_id}/v1"
            result, failure = await run_harness(self.harness, base_url, session_id, kwargs)
            # v0 passes no step: it is the weight version that served the session + 1, as for the built-in loop
            session.row["step"] = training_step(kwargs, worker.engine.served_version(session_id))
            results, failure = await self._end_session(worker.gateway, session_id, failure)
        finally:
            if session_id in worker.gateway.sessions:  # the rollout was cancelled: what was served is still recorded
                worker.gateway.end(session_id, "the rollout was cancelled before the harness finished")
            del worker.engine.session_params[session_id]
        counters = _session_counters(results, worker.engine)
        trained = [r for r in results if r.trained_tokens]  # branch order: the last branch last
        samples = [r.rollout.calls for r in trained or results[-1:]]
        fields, missing = worker.engine.take_extra_fields(session_id, samples)
        if missing:  # never expected: each call the gateway made ran under its session
            counters["gateway/engine_fields_missing"] += missing
        fields = [_with_weight_versions(f, kwargs) for f in fields]
        if failure is not None or not results:
            counters["gateway/harness_failed" if failure else "gateway/no_engine_call"] += 1
            metrics_sink.count(counters)
            why = failure or "the harness made no chat-completions call"
            return self._untrained(
                kwargs, why, result, fields[0] if fields else _with_weight_versions({}, kwargs), worker.gateway.vision
            )
        chosen = results[-1]
        over = [r for r in results if len(r.rollout.sample.prompt_ids) > self.prompt_length]
        counters["gateway/prompt_over_length"] += len(over)
        if not trained or trained[-1] is not chosen:
            # the session's reward is its last branch's: without that sample (its prompt is over
            # rollout.prompt_length, or it sampled nothing) nothing of the session is trained
            metrics_sink.report(chosen.result, counters)
            why = chosen.rollout.extra["gateway"]["trains"].get("untrained") or "its last branch sampled no token"
            return self._untrained(kwargs, str(why), result, fields[-1], worker.gateway.vision)
        _each_sampled_token_trained_once(trained)
        counters["gateway/samples"] += len(trained)
        # sampled tokens left out of an earlier branch's sample because a later branch (a fork) trains them
        shared = sum(sum(r.rollout.sample.response_mask) - r.trained_tokens for r in trained)
        if shared:
            counters["gateway/shared_tokens_masked"] += shared
        metrics_sink.report(chosen.result, counters)
        for other in results[:-1]:
            metrics_sink.report(other.result, {})
        outputs = []
        for r, engine_fields in zip(trained, fields, strict=True):
            self.rt.enforcer.enforce(r.result, training_step(kwargs, engine_fields.get("global_steps")))
            outputs.append(self._output(r, result, engine_fields))
        return outputs if every_branch else outputs[0]

    async def _end_session(self, gateway: Any, session_id: str, failure: str | None) -> tuple[list[Any], str | None]:
        """End the row's session with what its training plan trains: its results, and the failure to report (the
        gateway may have ended it while the harness ran, for being idle past its timeout: recorded there)."""
        session = gateway.sessions.get(session_id)
        if session is None:
            return [], failure or f"the session ended before the harness did: {gateway.ended.get(session_id)}"
        async with session.lock:
            untrainable = self._untrainable(session.branches, failure)
            plan = plan_training(session.branches, self.harness.branches, untrainable)
            return gateway.end(session_id, failure or "the harness finished", training=plan), failure

    def _untrainable(self, branches: Sequence[Any], failure: str | None) -> dict[int, str]:
        """Branch number -> why no sample of it can be trained: the harness failed (every branch), or its first
        prompt is longer than rollout.prompt_length (verl would cut it: the trainer would see other tokens than the
        engine)."""
        out = {}
        for branch in branches:
            if failure is not None:
                out[branch.number] = failure
            elif branch.first_prompt > self.prompt_length:
                out[branch.number] = (
                    f"the harness's first prompt renders to {branch.first_prompt} tokens, more than "
                    f"rollout.prompt_length={self.prompt_length}; raise data.max_prompt_length (and "
                    "rollout.prompt_length)"
                )
        return out

    async def _worker(self, sampling_params: Mapping[str, Any]) -> _WorkerGateway:
        loop = asyncio.get_running_loop()
        start = _WORKERS.get(id(loop))
        if start is not None and start.get_loop() is not loop:  # another event loop's, whose id this one reuses
            start = None
        if start is None or (start.done() and (start.cancelled() or start.exception() is not None)):  # tried again
            start = _WORKERS[id(loop)] = loop.create_task(self._start_worker(sampling_params))
        worker = await asyncio.shield(start)  # a cancelled rollout does not cancel the start the others await
        # Loop instances of one worker share these in a run; set them per rollout all the same (they are this
        # instance's: its server manager, check, records and limits; the sampling parameters are per session).
        worker.engine.server_manager = self.server_manager
        worker.gateway.runtime = self.rt  # a session's branches keep the runtime they started with
        worker.gateway.config.response_length = self.response_length
        worker.gateway.config.max_branches = self.harness.max_branches
        vision_of = (self.processor, self.rt.renderer.fingerprint)
        if worker.vision_of is None or worker.vision_of[0] is not vision_of[0] or worker.vision_of[1] != vision_of[1]:
            worker.gateway.vision, worker.gateway.no_images = worker_vision(self.processor, self.rt.renderer)
            worker.vision_of = vision_of
            if worker.gateway.vision is None and self.processor is not None:
                log.warning("%s: images are refused: %s", AGENT_NAME, worker.gateway.no_images)
        return worker

    async def _start_worker(self, sampling_params: Mapping[str, Any]) -> _WorkerGateway:
        import uvicorn

        from verl_ext.gateway.server import KEEP_ALIVE_S, create_app

        engine = ServerManagerEngine(self.server_manager, sampling_params)
        config = GatewayConfig(
            response_length=self.response_length, max_branches=self.harness.max_branches, open_on_demand=False
        )
        reader = ToolCallReader(self.tokenizer, self.config.actor_rollout_ref.rollout.multi_turn.format or "hermes")
        gateway = _SessionGateway(
            engine,
            self.rt,
            reader,
            config,
            markers=reasoning_markers(self.tokenizer),
        )  # its image side is set by _worker, before any session opens (worker_vision)
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
        return _WorkerGateway(gateway, engine, url, server)

    def _output(self, chosen: BranchResult, harness_result: Any, engine_fields: Mapping[str, Any]) -> AgentLoopOutput:
        """One training sample (``loop_output``): the branch's checked sample, its mask the turns the branch trains,
        and the images whose placeholder runs it holds (the list the record's image evidence was computed from, so
        the check's image view judged what verl's worker gets)."""
        loop_fields = {
            "harness_result": harness_result,
            "verl_ext_gateway": dict(chosen.rollout.extra["gateway"]),
            "turn_scores": [],
            "tool_rewards": [],
        }
        finished, mask = chosen.finished, chosen.trainer_mask  # the plan's mask, max_token_lag applied
        return loop_output(finished, chosen.result, engine_fields=engine_fields, loop_fields=loop_fields, mask=mask)

    def _untrained(
        self,
        kwargs: Mapping[str, Any],
        why: str,
        harness_result: Any,
        engine_fields: Mapping[str, Any],
        vision: ImageTokens | None,
    ) -> AgentLoopOutput:
        """A rollout whose harness failed (``untrained_output``): the row's prompt, rendered by a rollout of the
        gateway's image side, and one end-of-turn token, all masked out."""
        log.warning("%s: %s; the rollout is not trained", AGENT_NAME, why)
        fields = {**engine_fields, "harness_result": harness_result, "verl_ext_gateway": {"failed": why}}
        return untrained_output(self.rt.rollout(vision), list(kwargs["raw_prompt"]), {**fields, "turn_scores": []})


def _session_counters(results: Sequence[BranchResult], engine: ServerManagerEngine) -> Counter[str]:
    """What one session counts in ``tito/`` (the loop routing counts ``tito/loop/<name>`` once per rollout): forks,
    branches, records and thumbnails not written (each branch's own count, as verl_ext_tool_agent counts its
    rollout's: the rollout goes on) and the engine's counters since the last session, which it forgets."""
    counters: Counter[str] = Counter()
    counters["gateway/forks"] = sum(1 for r in results if "fork" in r.rollout.extra["gateway"])
    counters["gateway/branches"] = len(results)
    for r in results:  # what each branch's conclusion counted (records and thumbnails not written)
        counters.update(r.counters)
    counters.update(engine.counters)
    engine.counters.clear()
    return counters


def _each_sampled_token_trained_once(trained: Sequence[BranchResult]) -> None:
    """Raise where the samples a session hands verl train an engine-sampled token other than once (a verl_ext defect:
    ``plan_training`` gives each engine call to one branch)."""
    counts = trained_count([(r.rollout.calls, r.trajectory, r.trained_mask) for r in trained])  # type: ignore[misc]
    wrong = Counter(n for n in counts.values() if n != 1)
    if wrong:
        raise RuntimeError(
            f"{AGENT_NAME}: the session's {len(trained)} samples would train engine-sampled tokens other than once "
            f"(times trained -> tokens: {dict(wrong)}); this is a verl_ext defect, please report it"
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
