"""Fixtures for the in-process agent-loop tests (see loop_harness.py)."""

from loop_harness import make_loop  # noqa: F401 - a pytest fixture, re-exported for this folder
