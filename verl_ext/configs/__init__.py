"""verl_ext's configs, shipped in the package: the Hydra config group ``verl_ext`` (presets ``warn``, ``strict``,
``audit``, ``gateway``: the one place verl_ext's options are defined) and the agent-loop list for
``rollout.agent.agent_loop_config_path``. The job configs that select a preset (the GRPO + SGLang job, the CPU demo)
are in the repository's top-level ``configs/``.

The installed package adds ``pkg://verl_ext.configs`` to Hydra's search path (hydra_plugins/verl_ext_searchpath), so
``python -m verl.trainer.main_ppo ... +verl_ext=strict`` selects a preset; without that plugin, add
``hydra.searchpath=[pkg://verl_ext.configs]``.
"""

from pathlib import Path

CONFIG_DIR = Path(__file__).resolve().parent
SEARCHPATH = "pkg://verl_ext.configs"
PRESETS = ("warn", "strict", "audit", "gateway")
