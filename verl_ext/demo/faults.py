"""TEST ONLY: the demo's way to turn the CPU engine's faults on (verl_ext/engines/cpu_faults.py), per row or per
step, in one trainer start: one Hydra override to append to ``verl-ext demo``'s overrides (``run_demo``'s
``extra_overrides``, or the command line)::

    from verl_ext.demo.faults import fault_override, on_row, past_depth, stale_on_step, turn
    extra = [fault_override([on_row(past_depth(300), 0), on_row(turn(1), 1), stale_on_step(2)])]

``on_row(fault, index)`` limits a fault to the rollouts of the demo's training row ``index`` (by its question's
text, which the engine finds in the prompt); ``stale_on_step(step)`` makes the rollouts of training step ``step``
run on the previous step's weights. The faults change what the engine reports, never what it samples.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from verl_ext.engines.cpu import ENGINE_KWARGS_KEY
from verl_ext.engines.cpu_faults import parse_faults

DEFAULT_SHIFT = -0.5  # nats: 10x the numerics view's default drift threshold (0.05)


def past_depth(depth: int, shift: float = DEFAULT_SHIFT) -> dict[str, Any]:
    """Reported logprobs shifted from absolute position ``depth`` on (prompt included)."""
    return {"kind": "past_depth", "depth": depth, "shift": shift}


def turn(number: int, shift: float = DEFAULT_SHIFT) -> dict[str, Any]:
    """Reported logprobs shifted in the rollout's engine call ``number`` only (0 = the first)."""
    return {"kind": "turn", "turn": number, "shift": shift}


def bf16() -> dict[str, Any]:
    """Reported logprobs rounded through bfloat16."""
    return {"kind": "bf16"}


def stale_on_step(step: int) -> dict[str, Any]:
    """Step ``step``'s rollouts served on the weights of step ``step - 1``'s rollouts: the sync verl makes after
    step ``step - 1`` (it carries ``global_steps = step - 1``) is not applied. ``step`` is at least 2."""
    if step < 2:
        raise ValueError(f"stale_on_step: step must be at least 2 (step 1 has no previous weights), got {step}")
    return {"kind": "stale_weights", "versions": [step - 1]}


def row_question(index: int, split: str = "train") -> str:
    """The question text of the demo's row ``index`` (verl_ext/demo/data.py), as it appears in the prompt."""
    from verl_ext.demo.data import make_rows

    return str(make_rows(index + 1, split)[index]["prompt"][-1]["content"])


def on_row(fault: Mapping[str, Any], index: int, split: str = "train") -> dict[str, Any]:
    """``fault`` limited to the rollouts of the demo's row ``index``."""
    return {**fault, "rows_containing": row_question(index, split)}


def fault_override(faults: Sequence[Mapping[str, Any]]) -> str:
    """The Hydra override setting the CPU engine's faults (checked here as the engine will check them)."""
    return engine_override(faults)


def engine_override(faults: Sequence[Mapping[str, Any]], truth_log: str | None = None) -> str:
    """The Hydra override setting the CPU engine's options: its faults (checked here as the engine will check them)
    and, TEST ONLY, the file of its truth log (which version generated which ids, engines/cpu_pause.py)."""
    parse_faults(list(faults))  # a bad fault fails now, not when the engine starts
    options: dict[str, Any] = {"faults": list(faults)}
    if truth_log is not None:
        options["truth_log"] = truth_log
    return f"+actor_rollout_ref.rollout.engine_kwargs.{ENGINE_KWARGS_KEY}={_hydra(options)}"


def _hydra(value: Any) -> str:
    """``value`` (lists, maps with identifier keys, numbers, texts) in Hydra's override grammar."""
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{key}:{_hydra(item)}" for key, item in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra(item) for item in value) + "]"
    if isinstance(value, str):  # quoted, a quote inside escaped (Hydra keeps other backslashes as they are)
        if "\\" in value:
            raise ValueError(f"fault_override: a text with a backslash cannot be passed as an override: {value!r}")
        return "'" + value.replace("'", "\\'") + "'"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"fault_override: cannot write {value!r} as a Hydra value")
    return repr(value)
