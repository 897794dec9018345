"""Which loop wrote a rollout record: the report's fix texts depend on it (switching to verl_ext's loop is no fix for
a record verl_ext's loop wrote) and so does the page's furniture (the standalone gateway has sessions, not steps).

A record names its loop under ``loop`` (``Rollout.extra``); a record written before that key was is read by what
each loop writes: a gateway record has the ``gateway`` key, with ``trains`` where a trainer took the branch
(``verl_ext_gateway_agent``) and without it from ``verl-ext gateway``; ``verl_ext_tool_agent`` writes the row's
``data_source`` and ``index``; verl's stock loop under ``verl_ext_audited_tool_agent`` writes no extra key. A record
that none of these fits (one a test or a script built) is ``UNKNOWN`` and gets the stock loop's texts, the loop a
user runs before switching.
"""

from __future__ import annotations

from enum import StrEnum

from verl_ext.check.record import RolloutRecord


class Loop(StrEnum):
    """A loop that writes rollout records, by the name a user knows it by."""

    TOOL_AGENT = "verl_ext_tool_agent"
    AUDITED = "verl_ext_audited_tool_agent"  # verl's stock tool_agent, watched: its tokens are the stock loop's
    GATEWAY_AGENT = "verl_ext_gateway_agent"
    GATEWAY = "verl-ext gateway"  # the standalone gateway: sessions, no training step
    UNKNOWN = "unknown"

    @property
    def builds_tokens(self) -> bool:
        """verl_ext's own loop built the training tokens: a token defect there is verl_ext's bug, not the setup's."""
        return self in (Loop.TOOL_AGENT, Loop.GATEWAY_AGENT, Loop.GATEWAY)

    @property
    def is_gateway(self) -> bool:
        return self in (Loop.GATEWAY_AGENT, Loop.GATEWAY)


def loop_of(record: RolloutRecord) -> Loop:
    """The loop that wrote ``record`` (the module docstring's rule)."""
    named = record.extra.get("loop")
    if isinstance(named, str) and named in Loop._value2member_map_:
        return Loop(named)
    gateway = record.extra.get("gateway")
    if isinstance(gateway, dict):
        return Loop.GATEWAY_AGENT if gateway.get("trains") is not None else Loop.GATEWAY
    if "data_source" in record.extra:
        return Loop.TOOL_AGENT
    return Loop.UNKNOWN
