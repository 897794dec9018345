#!/usr/bin/env bash
# Install verl 0.9.1 + SGLang 0.5.12 + verl_ext on a GPU node (every node of the Ray cluster).
#
# `pip install "verl[sglang]==0.9.1"` is unresolvable: verl needs transformers !=5.6.0,<5.11 (its [sglang] extra pins
# 5.9.0) while sglang 0.5.12 pins transformers==5.6.0. SGLang 0.5.12 runs with transformers 5.9.0, so: install verl
# (which brings transformers), then SGLang with --no-deps, then SGLang's own requirements minus its transformers pin.
# Do not use sglang 0.5.23 with verl 0.9.1 (verl's server calls dataclasses.fields(ServerArgs), no longer a dataclass).
set -euo pipefail
PIP=${PIP:-pip}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
$PIP install "verl==0.9.1" "transformers==5.9.0"
$PIP install --no-deps "sglang==0.5.12"
# SGLang 0.5.12's declared requirements, except transformers (kept at verl's 5.9.0) and torch (SGLang's pin, 2.11.0, is
# what its CUDA kernels are built for: install it first if your image has another).
python - <<'PY' > /tmp/sglang_reqs.txt
from importlib.metadata import requires
for r in requires("sglang") or []:
    if "extra ==" in r or r.split(";")[0].replace(" ", "").startswith(("transformers", "torch==", "torchvision", "torchaudio")):
        continue
    print(r)
PY
$PIP install -r /tmp/sglang_reqs.txt
$PIP install -e "$REPO"
python -c "import sglang, verl, verl_ext; print('sglang', sglang.__version__, 'verl', verl.__version__)"
