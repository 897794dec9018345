"""``PreflightError``: the driver-side refusal of a config or dataset, raised by the preflight
(verl_ext.plugin.preflight) and by loop routing's reading of ``agent_loop_config_path``; a leaf, so neither imports
the other for it."""

from __future__ import annotations

from verl_ext.core.errors import VerlExtError


class PreflightError(VerlExtError, ValueError):
    """verl_ext's part of the config or the dataset would fail or bypass verl_ext: stop before Ray starts."""
