"""verl_ext: inference tokens == training tokens for multi-turn RL in verl, guaranteed and proven.

Layout (dependencies point inward; docs/architecture.md draws it):
- ``verl_ext.core``: the token core. Knows only a Hugging Face tokenizer and its chat template.
- ``verl_ext.check``: the end-of-rollout check and the typed rollout record, on top of the core.
- ``verl_ext.telemetry`` and ``verl_ext.report``: ``tito/`` metrics, record files, the HTML report.
- ``verl_ext.runtime``: the one rollout runtime (build, turn, conclude) every loop and the gateway use.
- ``verl_ext.engines``, ``verl_ext.gateway``, ``verl_ext.plugin``, ``verl_ext.demo``, ``verl_ext.cli``: the edge
  (verl, Ray, torch, SGLang, the harness gateway, the command line); ``verl_ext.configs``: the Hydra group.
"""

__version__ = "0.1.0"
