#!/usr/bin/env bash
# Install verl 0.9.1 + SGLang 0.5.12 + verl_ext on a GPU node (every node of the Ray cluster), into one interpreter:
#   PYTHON=/path/to/python recipes/sglang/install.sh        (default: python3; pip runs as "$PYTHON -m pip")
# Every version comes from scripts/gpu/versions.txt (pip constraints, the one place the GPU stack's versions are
# pinned; the offline bundle reads it too). TORCH_INDEX_URL picks torch's CUDA build, e.g.
# https://download.pytorch.org/whl/cu130 (default: the package index's torch). DRY_RUN=1 prints the commands only.
#
# `pip install "verl[sglang]==0.9.1"` is unresolvable: verl needs transformers !=5.6.0,<5.11 (its [sglang] extra pins
# 5.9.0) while sglang 0.5.12 pins transformers==5.6.0. SGLang 0.5.12 runs with transformers 5.9.0, so: torch at
# SGLang's pin, verl (which brings transformers), then SGLang with --no-deps, then SGLang's own requirements minus its
# transformers pin. Do not use sglang 0.5.23 with verl 0.9.1 (verl's server calls dataclasses.fields(ServerArgs),
# no longer a dataclass).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PINS="$REPO/scripts/gpu/versions.txt"
PYTHON=${PYTHON:-python3}
TORCH_VERSION=$(sed -n 's/^torch==\([^ ;#]*\).*/\1/p' "$PINS")
if [ -z "$TORCH_VERSION" ]; then
  echo "install.sh: $PINS has no torch==VERSION line; it pins the torch SGLang's kernels are built for" >&2
  exit 2
fi
run() { if [ -n "${DRY_RUN:-}" ]; then printf '%q ' "$@"; echo; else "$@"; fi; }

run "$PYTHON" -m pip install -c "$PINS" ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} torch
run "$PYTHON" -m pip install -c "$PINS" verl transformers torch
run "$PYTHON" -m pip install -c "$PINS" --no-deps sglang
REQS=$(mktemp "${TMPDIR:-/tmp}/sglang-requirements.XXXXXX")
trap 'rm -f "$REQS"' EXIT
if [ -n "${DRY_RUN:-}" ]; then
  run "$PYTHON" "$HERE/sglang_requirements.py" --torch "$TORCH_VERSION"
else
  "$PYTHON" "$HERE/sglang_requirements.py" --torch "$TORCH_VERSION" > "$REQS"
fi
run "$PYTHON" -m pip install -c "$PINS" -r "$REQS" torch transformers
run "$PYTHON" -m pip install -c "$PINS" -e "$REPO"
run "$PYTHON" -c "import sglang, torch, transformers, verl, verl_ext
assert torch.__version__.split('+')[0] == '$TORCH_VERSION', f'torch {torch.__version__}, expected $TORCH_VERSION'
print('sglang', sglang.__version__, 'verl', verl.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
