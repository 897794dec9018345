"""Rollout engines verl_ext plugs into verl. ``cpu``: a transformers CPU backend for tests and
demos; ``sglang_server``/``sglang_output``: verl_ext's token-exact SGLang server."""
