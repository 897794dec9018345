"""verl_ext: inference tokens == training tokens for multi-turn RL in verl, guaranteed and proven.

Layout (dependencies point inward):
- ``verl_ext.core``: the token core. Knows only a Hugging Face tokenizer and its chat template.
- ``verl_ext.cli``: the ``verl-ext`` command line, on top of the core.
"""

__version__ = "0.1.0"
