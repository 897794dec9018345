"""The CPU demo: a tiny random Qwen3-architecture model, an arithmetic tool-calling dataset, a calculator tool and a
rule reward, for running verl's real GRPO trainer end to end on CPU (`verl-ext demo`, verl_ext.demo.run)."""
