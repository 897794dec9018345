"""Rollout engines verl_ext plugs into verl. ``cpu``: a transformers CPU backend for tests and demos."""
