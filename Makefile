# Every target sets itself up on a fresh clone; only python3.11 (or python3) is needed.
SHELL := /bin/bash
.DEFAULT_GOAL := test

PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stamp
PIP := $(BIN)/pip install -c constraints.txt
PYTEST_ARGS ?= --durations=25
# Two pytest-xdist workers (CI has two cores); the modules that start Ray run one after another on one of them
# (tests/conftest.py). PYTEST_WORKERS=0 runs the suite in one process.
PYTEST_WORKERS ?= 2

export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: venv tokenizers browser sglang-cpu test demo bench lint clean

venv: $(STAMP)

# Each environment stamp holds a hash of the files it was built from, and is rebuilt when they hash to another value:
# keyed on content, not on modification times, so the first `make` in a fresh clone (every file newer than any stamp)
# does not reinstall into the .venv that is there, and an edit to a dependency file does.
content_hash = $(shell $(PYTHON) -c 'import hashlib, sys; h = hashlib.sha256(); \
	[h.update(f.encode() + b"\0" + open(f, "rb").read() + b"\0") for f in sys.argv[1:]]; print(h.hexdigest()[:16])' $(1))
ENV_HASH := $(call content_hash,setup.py constraints.txt)
SGLANG_HASH := $(call content_hash,setup.py constraints.txt requirements-sglang-cpu.txt)
# FORCE (always rebuilt) when the stamp $(1) is missing or holds another hash than $(2)
stale = $(if $(filter $(2),$(shell cat $(1) 2>/dev/null)),,FORCE)
.PHONY: FORCE
FORCE:

# Rebuilt only when the dependency specification changes; torch is installed first and pinned
# by constraints.txt so that nothing can pull a CUDA build.
$(STAMP): $(call stale,$(STAMP),$(ENV_HASH))
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e '.[test]'
	$(BIN)/python -c "import sys, torch; \
	ok = torch.__version__.startswith('2.13.0') and torch.version.cuda is None and not torch.cuda.is_available(); \
	sys.exit(0 if ok else 'expected the CPU build of torch 2.13.0, got ' + torch.__version__ + ' (cuda=' + str(torch.version.cuda) + ')')"
	@echo $(ENV_HASH) > $@

tokenizers: venv
	$(BIN)/python scripts/unpack_tokenizers.py

lint: venv
	$(BIN)/ruff check verl_ext tests scripts hydra_plugins recipes bench

# The report's browser test needs a headless chromium. With VERL_EXT_REQUIRE_BROWSER=1 (the default here) the test
# fails rather than skips without it, and a missing chromium is installed with apt-get (Debian's), which needs root.
# Without root: put chromium (or chromium-browser) on PATH, or `make test VERL_EXT_REQUIRE_BROWSER=0` to skip the test.
VERL_EXT_REQUIRE_BROWSER ?= 1
export VERL_EXT_REQUIRE_BROWSER
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || [ "$(VERL_EXT_REQUIRE_BROWSER)" != 1 ] || \
	  { [ "$$(id -u)" = 0 ] || { echo "make: the report's browser test needs chromium, and installing it with apt-get \
	needs root: put chromium (or chromium-browser) on PATH, or run 'make test VERL_EXT_REQUIRE_BROWSER=0' to skip \
	that test" >&2; exit 1; }; \
	  apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null; }

# SGLang 0.5.12 for the CPU tests of verl_ext's SGLang server: --no-deps (never its GPU stack or CUDA torch) plus the
# light modules its token path imports. The tests fail rather than skip without it (VERL_EXT_REQUIRE_SGLANG=1).
VERL_EXT_REQUIRE_SGLANG ?= 1
export VERL_EXT_REQUIRE_SGLANG
SGLANG_STAMP := $(VENV)/.sglang-cpu
sglang-cpu: $(SGLANG_STAMP)
$(SGLANG_STAMP): $(call stale,$(SGLANG_STAMP),$(SGLANG_HASH)) | $(STAMP)
	$(PIP) --no-deps sglang==0.5.12
	$(PIP) -r requirements-sglang-cpu.txt
	@echo $(SGLANG_HASH) > $@

test: venv tokenizers browser sglang-cpu
	$(BIN)/ruff check verl_ext tests scripts hydra_plugins recipes bench
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The main job: verl's GRPO trainer on CPU with verl_ext switched on; writes build/demo/report.html.
demo: venv tokenizers
	$(BIN)/verl-ext demo --out build/demo

# Benchmarks (ratios against baselines measured in the same run): every bench/*.py script but the helpers
# (bench/_*.py), e.g. bench/turns.py (per-turn bookkeeping: verl_ext vs verl 0.9.1's Continuous Token builder, a full
# re-render and the floor).
# TOKENIZERS_PARALLELISM=true as verl's PPO runtime env sets it (the tests' false would hide the check's parallel encode).
bench: venv tokenizers
	@set -e; for script in bench/[!_]*.py; do echo "== $$script"; TOKENIZERS_PARALLELISM=true $(BIN)/python $$script; done

clean:
	rm -rf $(VENV) build
