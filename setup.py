from setuptools import find_packages, setup

setup(
    name="verl_ext",
    version="0.1.0",
    description="verl plugin guaranteeing that training tokens == inference tokens in multi-turn rollouts",
    license="Apache-2.0",
    # hydra_plugins.verl_ext_searchpath: Hydra finds it and adds pkg://verl_ext.configs (the `verl_ext` config group)
    packages=find_packages(include=["verl_ext*"]) + ["hydra_plugins.verl_ext_searchpath"],
    package_data={
        "verl_ext.report": ["templates/*.j2", "templates/*.css"],  # the report's Jinja templates
        "verl_ext.configs": ["*.yaml", "verl_ext/*.yaml"],  # the config group's presets, agent_loops.yaml
    },
    python_requires=">=3.10",
    install_requires=[
        "transformers>=5.5.3,<5.11,!=5.6.0",
        "jinja2>=3.1",
        "verl==0.9.1",
        "cachetools",
        "TransferQueue>=0.1.10",
        "fastapi",
        "uvicorn",
        "matplotlib",
        "rapidfuzz>=3.9",  # the check's alignment: banded edit distance in C, near-linear on long rollouts
    ],
    extras_require={
        # openai-agents 0.4.2: the newest that accepts openai==2.6.1, which SGLang 0.5.12 pins (`make sglang-cpu`);
        # 0.24.0 needs openai>=3.
        "test": [
            "pytest>=8,<9.2",  # 9.2 computes node ids anew, so xdist 3.8 cannot group tests (xdist_group)
            "pytest-asyncio",
            "pytest-timeout",
            "pytest-xdist>=3.5",  # `make test` runs two workers; Ray modules share one (tests/conftest.py)
            "hypothesis>=6",
            "ruff",
            # openai-agents 0.4.2 builds usage objects that openai 2.54.0 refuses (InputTokensDetails needs
            # cache_write_tokens): pinned to the version SGLang 0.5.12 pins, which both accept.
            "openai==2.6.1",
            "openai-agents==0.4.2",
            "anthropic==2.14.0",  # the gateway's Messages endpoint, tested with the official SDK
        ],
        # No "sglang" extra: verl 0.9.1 and sglang 0.5.12 do not resolve together (transformers pins), so pip could
        # never install one. recipes/sglang/install.sh installs SGLang for GPUs (sglang --no-deps plus its
        # requirements), `make sglang-cpu` the pieces the CPU tests import.
    },
    entry_points={
        "console_scripts": ["verl-ext = verl_ext.cli.main:main"],
        "verl.plugins": ["verl_ext = verl_ext.plugin"],
    },
)
