"""An OpenAI-compatible gateway that keeps the engine's tokens for harnesses verl_ext did not write.

A harness speaks chat completions to ``/sessions/{id}/v1``; each session's turns are built by the token core
(the first prompt rendered once, the engine's ids kept as sampled, later messages appended as deltas), history is
matched message by message, a request that departs from it forks a branch, and each branch is checked and
recorded as one rollout when the session ends. Modules, one job each:

- ``request``: the request body, checked field by field (400 naming the field);
- ``history``: message keys, digests and the divergence (which message, which field);
- ``branch``: one rollout (a trajectory and its replayable log); ``session``: branches and matching;
- ``parsing``: tool calls (``verl_ext.core.turn_parse``, the built-in loop's parse step, with verl's parsers) and
  reasoning; ``engine`` / ``cpu_engine``: the engine;
- ``service``: the gateway itself; ``conclude``: check and records; ``server``: the HTTP layer.

Importing the package imports neither verl nor Ray: a ``ToolCallReader`` (verl's parser) and the CPU engine import
verl when built.
"""
