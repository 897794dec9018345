"""Errors raised by the token core. Each message names the problem and the fix."""


class TemplateError(ValueError):
    """The chat template cannot be used the way a rollout needs (the message says why and what to do)."""


class TrajectoryError(ValueError):
    """A trajectory operation was called with input that would break the token invariants."""
