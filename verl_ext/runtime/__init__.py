"""One rollout runtime under every loop and the gateway: build it, step a turn, conclude a rollout.

``verl_ext_tool_agent``, the audited loop, ``verl_ext_gateway_agent`` and ``verl-ext gateway`` all go through it, so
a rollout is built, stepped and concluded one way wherever it comes from.

Runtime API (what a loop or the gateway calls):
    ``RolloutRuntime.build`` probes the template once and refuses an unsupported one, with the check, the policy's
    enforcer and the record writer; ``rollout`` makes one ``LiveRollout`` (``verl_ext.runtime.rollout``: the object
    each caller drives from start to conclusion, which assembles the ``Rollout`` once); ``turn_budget`` is what a
    turn may still sample; ``turn`` generates one turn through the caller's engine, judges how it ended, records
    the engine call, validates the output and reads it into a message; ``keep_sampled`` appends a turn to the
    trajectory as sampled tokens; ``conclude`` checks a finished rollout (not when the check is off), writes its
    record (a failed write is counted, never raised), reports its metrics and applies the policy; ``judge`` does
    the first two only, for a caller that reports and enforces per training sample (the gateway).
    ``stop_text_id`` turns a stop text into its one id (``verl_ext.core.turn_end``).

Hooks (what a caller plugs in, never the runtime's business):
    the engine (``generate``: max tokens -> an output with ``token_ids`` and ``log_probs``), the tool-call reader
    (``read``: output ids -> a ``ParsedTurn``), and the metrics sink (``RolloutRuntime.sink``: verl's ``tito/``
    metrics in the plugin, nothing in the standalone gateway). Tools, sessions, forks and what a trainer gets are the
    caller's.
"""

from verl_ext.runtime.rollout import FinishedRollout, LiveRollout
from verl_ext.runtime.rollout_runtime import RolloutRuntime, checked_off
from verl_ext.runtime.turn import Generated, Turn, keep_sampled, turn_budget

__all__ = [
    "FinishedRollout",
    "Generated",
    "LiveRollout",
    "RolloutRuntime",
    "Turn",
    "checked_off",
    "keep_sampled",
    "turn_budget",
]
