"""Bypass mode's numbers, from inside the actor's loss on the FSDP ranks, with no extra forward pass.

In bypass mode (``algorithm.rollout_correction.bypass_mode``) verl skips the old-logprob pass: ``old_log_prob`` is the
rollout's (the engine's) and the only trainer logprobs of the batch are the ones the loss computes. verl looks the
policy loss up by name in ``POLICY_LOSS_REGISTRY`` on every micro-batch (``verl.workers.utils.losses.ppo_loss`` ->
``get_policy_loss_fn``); every entry of the registry, now and registered later, is wrapped by ``measuring``, which
measures, then delegates to the loss the config names. On the micro-batches seen before the step's first optimizer
update, ``log_prob`` is the recompute the old-logprob pass would have given; later ones include the policy's own
update, so their rollouts are counted ``numerics_unavailable``, not measured.

The loss function sees no key (no rollout id, no prompt): the side channel is the micro-batch itself, which
``ppo_loss`` receives (a TensorDict that keeps verl's non-tensor columns: the loop's rollout id and turn starts, the
prompts), and the driver's ``_update_actor`` hook (verl_ext.plugin.numerics_trainer) puts the step's switch into the
batch's meta information; with no switch (not bypass mode, or verl_ext's driver hook absent) nothing is measured.
``ppo_loss`` is wrapped to measure first: in strict mode it zeroes the drifting rows of the micro-batch's
``response_mask`` before verl reads it, so the policy, entropy and KL terms all leave them out; the token-mean
normaliser (``batch_num_tokens``, counted by the engine over the whole mini-batch before any loss) still counts
their tokens. A micro-batch whose every row drifts raises NumericsStrictError. The wrapped registry losses measure
only where no wrapped ``ppo_loss`` did (a policy loss called with a micro-batch in scope by other code). The
summaries go to the driver through verl_ext.plugin.numerics_sink (a named Ray actor, deduplicated by rollout id),
not through verl's metrics, which are averaged over ranks.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

from verl_ext.core.numerics import NumericsOptions
from verl_ext.plugin import numerics_sink
from verl_ext.plugin.numerics_rows import prompt_lengths, row_keys, rows_of, summarize_rows
from verl_ext.plugin.numerics_trainer import ANNOUNCE_KEY, NumericsStrictError, _refuse_all_drifting

log = logging.getLogger("verl_ext.plugin")

SOURCE_BYPASS = "bypass_loss"
_micro_batch: contextvars.ContextVar[Any] = contextvars.ContextVar("verl_ext_micro_batch", default=None)
_measured_in_ppo_loss: contextvars.ContextVar[bool] = contextvars.ContextVar("verl_ext_measured", default=False)
_updated_step: list[int | None] = [None]  # the last step this rank ran an optimizer update in


@contextlib.contextmanager
def micro_batch_in_scope(data: Any) -> Iterator[None]:
    """The policy loss called inside reads ``data`` as its micro-batch (the side channel in)."""
    token = _micro_batch.set(data)
    try:
        yield
    finally:
        _micro_batch.reset(token)


def announcement(data: Any) -> dict[str, Any] | None:
    """The driver's switch in a micro-batch (None: measure nothing)."""
    if data is None:
        return None
    from verl.utils import tensordict_utils as tu

    value = tu.get_non_tensor_data(data, ANNOUNCE_KEY, None)
    return value if isinstance(value, dict) else None


def _options(switch: dict[str, Any]) -> NumericsOptions:
    return NumericsOptions(
        depth_edges=tuple(switch["depth_edges"]),
        drift_mean_abs_delta=float(switch["drift_mean_abs_delta"]),
        token_abs_delta=float(switch["token_abs_delta"]),
    )


def measure(switch: dict[str, Any], data: Any, old_log_prob: Any, log_prob: Any, response_mask: Any) -> list[int]:
    """Measure one micro-batch (or count it unavailable, after the step's first update) and report it; return the
    rows strict mode masks out of the loss (bypass mode can only mask: advantages exist). Every row drifting under
    strict raises NumericsStrictError, as the driver's path does: an all-zero mask would leave nothing to train on."""
    step = int(switch["step"])
    key = batch_key(data, step)
    keys = row_keys(data, prompt_lengths(data))
    if keys is None:
        numerics_sink.report(unavailable_without_id=int(response_mask.shape[0]), batch_key=key)
        return []
    if _updated_step[0] == step:
        ids = [i for i in keys.rollout_ids if i]
        numerics_sink.report(unavailable=ids, unavailable_without_id=len(keys.rollout_ids) - len(ids), batch_key=key)
        return []
    options = _options(switch)
    summary = summarize_rows(
        keys,
        rows_of(log_prob.detach().float()),
        rows_of(old_log_prob.detach().float()),
        rows_of(response_mask),
        options,
        SOURCE_BYPASS,
        step,
    )
    masked = list(summary.drifting_rows) if switch.get("strict") else []
    numerics_sink.report(
        summary.measured,
        summary.unavailable,
        summary.unavailable_without_id,
        masked=[keys.rollout_ids[r] or "" for r in masked],
        batch_key=key,
    )
    if masked:
        _refuse_all_drifting(summary, int(response_mask.shape[0]), step, options)
    return masked


def batch_key(data: Any, step: int) -> tuple[int, str] | None:
    """The micro-batch's identity: the step and a digest of its token ids, the same on every rank that holds it
    (tensor or sequence parallel), so the collector counts its rows without an id once; None where it has none."""
    import hashlib

    digest = hashlib.sha256()
    try:
        for name in ("prompts", "responses"):
            t = data[name]
            digest.update((t.values() if t.is_nested else t).detach().cpu().numpy().tobytes())
            if t.is_nested:
                digest.update(t.offsets().cpu().numpy().tobytes())
    except (KeyError, AttributeError, RuntimeError):
        return None
    return step, digest.hexdigest()


def _zero_rows(mask: Any, rows: list[int]) -> Any:
    """``mask`` (padded, or nested jagged as verl's no-padding micro-batches hold it) with ``rows`` all 0."""
    import torch

    keep = torch.ones(mask.size(0), dtype=torch.bool, device=mask.device)
    keep[rows] = False
    if not mask.is_nested:
        return mask * keep.view(-1, *([1] * (mask.dim() - 1))).to(mask.dtype)
    # rebuilt from its rows: a jagged tensor made from values and offsets alone pads to the wrong length
    rows_kept = [row * keep[i].to(row.dtype) for i, row in enumerate(mask.unbind())]
    return torch.nested.as_nested_tensor(rows_kept, layout=torch.jagged)


def measuring(loss: Callable[..., Any]) -> Callable[..., Any]:
    """``loss`` with the numerics measured first on micro-batches the driver switched on (module docstring)."""
    if getattr(loss, "_verl_ext_measuring", False):
        return loss

    @functools.wraps(loss)
    def measured(*args: Any, **kwargs: Any) -> Any:
        data = _micro_batch.get()
        switch = None if _measured_in_ppo_loss.get() else announcement(data)
        if switch is not None and {"old_log_prob", "log_prob", "response_mask"} <= kwargs.keys():
            try:
                mask = kwargs["response_mask"]
                if rows := measure(switch, data, kwargs["old_log_prob"], kwargs["log_prob"], mask):
                    kwargs["response_mask"] = _zero_rows(mask, rows)
            except NumericsStrictError:
                raise  # strict mode's refusal is meant to stop the run
            except Exception:  # the view must not stop training; the driver counts what was not measured
                log.exception("verl_ext numerics: measuring in the policy loss failed")
        return loss(*args, **kwargs)

    measured._verl_ext_measuring = True  # type: ignore[attr-defined]
    return measured


def install_registry(core_algos: Any) -> None:
    """Wrap every loss in ``POLICY_LOSS_REGISTRY`` and every one ``register_policy_loss`` adds later
    (verl.trainer.ppo.core_algos)."""
    registry = core_algos.POLICY_LOSS_REGISTRY
    for name, fn in list(registry.items()):
        registry[name] = measuring(fn)
    register = core_algos.register_policy_loss
    if getattr(register, "_verl_ext", False):
        return

    @functools.wraps(register)
    def register_policy_loss(name: str) -> Callable[[Any], Any]:
        decorate = register(name)

        def decorator(fn: Any) -> Any:
            decorate(fn)  # verl's own registration first (it returns fn), then the entry wrapped
            registry[name] = measuring(fn)
            return fn

        return decorator

    register_policy_loss._verl_ext = True  # type: ignore[attr-defined]
    core_algos.register_policy_loss = register_policy_loss


def install_micro_batch_channel(losses: Any) -> None:
    """Wrap ``ppo_loss`` (verl.workers.utils.losses) to measure its micro-batch first and, in strict mode, zero the
    drifting rows of ``data["response_mask"]`` before verl reads it: ``ppo_loss`` builds the policy, entropy and KL
    terms from that one mask, so all three leave those rows out. What masking does not change: the token-mean
    normaliser ``batch_num_tokens`` is counted by the engine over the whole mini-batch (all data-parallel ranks)
    before any loss runs, so the masked tokens stay in the denominator and the other rows' terms are scaled as if
    they were there. The policy loss it calls reads the micro-batch too (``measuring``), and skips what was measured
    here."""
    original = losses.ppo_loss
    if getattr(original, "_verl_ext", False):
        return

    @functools.wraps(original)
    def ppo_loss(config: Any, model_output: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        switch = announcement(data)
        if switch is None:
            with micro_batch_in_scope(data):
                return original(config, model_output, data, *args, **kwargs)
        data = _measured_and_masked(switch, model_output, data)
        token = _measured_in_ppo_loss.set(True)
        try:
            with micro_batch_in_scope(data):
                return original(config, model_output, data, *args, **kwargs)
        finally:
            _measured_in_ppo_loss.reset(token)

    ppo_loss._verl_ext = True  # type: ignore[attr-defined]
    losses.ppo_loss = ppo_loss


def _measured_and_masked(switch: dict[str, Any], model_output: Any, data: Any) -> Any:
    """``data`` measured; a shallow copy with strict mode's drifting rows zeroed in its response mask, or itself."""
    try:
        from verl.workers.utils.padding import no_padding_2_padding

        log_prob = no_padding_2_padding(model_output["log_probs"], data)
        fields = data.select("response_mask", "old_log_probs").to_padded_tensor()
        rows = measure(switch, data, fields["old_log_probs"], log_prob, fields["response_mask"].bool())
    except NumericsStrictError:
        raise  # strict mode's refusal is meant to stop the run
    except Exception:  # the view must not stop training; the driver counts what was not measured
        log.exception("verl_ext numerics: measuring in ppo_loss failed")
        return data
    if not rows:
        return data
    data = data.copy()
    data["response_mask"] = _zero_rows(data["response_mask"], rows)
    return data


def install_update_marker(engine_base: Any) -> None:
    """Wrap ``BaseEngine.train_batch`` (one mini-batch: forward-backward over its micro-batches, then the optimizer
    step): once it returns, this rank's policy has moved in that step, and later micro-batches are not measured."""
    cls = engine_base.BaseEngine
    original = cls.train_batch
    if getattr(original, "_verl_ext", False):
        return

    @functools.wraps(original)
    def train_batch(self: Any, data: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, data, *args, **kwargs)
        switch = announcement(data)
        if switch is not None:
            _updated_step[0] = int(switch["step"])
        return out

    train_batch._verl_ext = True  # type: ignore[attr-defined]
    cls.train_batch = train_batch
