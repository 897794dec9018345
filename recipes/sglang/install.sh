#!/usr/bin/env bash
# Install verl 0.9.1 + SGLang 0.5.12 + verl_ext on a GPU node (every node of the Ray cluster), into one interpreter:
#   PYTHON=/path/to/python recipes/sglang/install.sh        (default: python3; pip runs as "$PYTHON -m pip")
# The versions are pinned in versions.env, next to this script. TORCH_INDEX_URL picks torch's CUDA build, e.g.
# https://download.pytorch.org/whl/cu130 (default: the package index's torch). DRY_RUN=1 prints the commands only.
#
# `pip install "verl[sglang]==0.9.1"` is unresolvable: verl needs transformers !=5.6.0,<5.11 (its [sglang] extra pins
# 5.9.0) while sglang 0.5.12 pins transformers==5.6.0. SGLang 0.5.12 runs with transformers 5.9.0, so: torch at
# SGLang's pin, verl (which brings transformers), then SGLang with --no-deps, then SGLang's own requirements with
# transformers at verl's pin. Do not use sglang 0.5.23 with verl 0.9.1 (verl's server calls
# dataclasses.fields(ServerArgs), no longer a dataclass).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
# shellcheck source=versions.env
source "$HERE/versions.env"
PYTHON=${PYTHON:-python3}
run() { if [ -n "${DRY_RUN:-}" ]; then printf '%q ' "$@"; echo; else "$@"; fi; }
PINS=("torch==$TORCH_VERSION" "transformers==$TRANSFORMERS_VERSION")  # repeated on every install: nothing moves them

run "$PYTHON" -m pip install ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "torch==$TORCH_VERSION"
run "$PYTHON" -m pip install "verl==$VERL_VERSION" "${PINS[@]}"
run "$PYTHON" -m pip install --no-deps "sglang==$SGLANG_VERSION"
REQS=$(mktemp "${TMPDIR:-/tmp}/sglang-requirements.XXXXXX")
trap 'rm -f "$REQS"' EXIT
if [ -n "${DRY_RUN:-}" ]; then
  run "$PYTHON" "$HERE/sglang_requirements.py" --torch "$TORCH_VERSION"
else
  "$PYTHON" "$HERE/sglang_requirements.py" --torch "$TORCH_VERSION" > "$REQS"
fi
run "$PYTHON" -m pip install -r "$REQS" "${PINS[@]}"
run "$PYTHON" -m pip install -e "$REPO"
run "$PYTHON" -c "import sglang, torch, transformers, verl, verl_ext
assert torch.__version__.split('+')[0] == '$TORCH_VERSION', f'torch {torch.__version__}, expected $TORCH_VERSION'
print('sglang', sglang.__version__, 'verl', verl.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
