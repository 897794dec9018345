"""Conversation pieces shared by the core tests (the tool schema and call live in tests/rollouts.py)."""

from rollouts import TOOLS, call

CALL = call("1+1")

__all__ = ["CALL", "TOOLS"]
