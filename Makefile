# Every target sets itself up on a fresh clone; only python3.11 (or python3) is needed.
SHELL := /bin/bash
.DEFAULT_GOAL := test

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stamp
PIP := $(BIN)/pip install -c constraints.txt
PYTEST_ARGS ?=

export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: venv tokenizers test demo lint clean

venv: $(STAMP)

# Rebuilt only when the dependency specification changes; torch is installed first and pinned
# by constraints.txt so that nothing can pull a CUDA build.
$(STAMP): setup.py constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e '.[test]'
	$(BIN)/python -c "import sys, torch; \
	ok = torch.__version__.startswith('2.13.0') and torch.version.cuda is None and not torch.cuda.is_available(); \
	sys.exit(0 if ok else 'expected the CPU build of torch 2.13.0, got ' + torch.__version__ + ' (cuda=' + str(torch.version.cuda) + ')')"
	@touch $@

tokenizers: venv
	$(BIN)/python scripts/unpack_tokenizers.py

lint: venv
	$(BIN)/ruff check verl_ext tests scripts

test: venv tokenizers
	$(BIN)/ruff check verl_ext tests scripts
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

demo: venv tokenizers
	$(BIN)/verl-ext check-template build/tokenizers/qwen3
	$(BIN)/verl-ext replay examples/replay/qwen3_tool_call.jsonl --tokenizer build/tokenizers/qwen3

clean:
	rm -rf $(VENV) build
