#!/usr/bin/env bash
# Submit the CPU demo (verl's GRPO trainer on CPU with verl_ext, job config configs/cpu_demo.yaml) to a running Ray
# cluster, stream its log, and exit with the job's terminal status (0 only when it SUCCEEDED; recipes/ray_submit.py):
#   recipes/cpu_demo/cluster.sh start && recipes/cpu_demo/submit.sh; recipes/cpu_demo/cluster.sh stop
# The trainer joins the cluster (RAY_ADDRESS), so the demo's own local-Ray settings are removed from its config. Both
# nodes run on this machine, so OUT (the model, data, records and report) is on storage both see.
set -euo pipefail
DASHBOARD_PORT=${DASHBOARD_PORT:-28265}
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}  # as cluster.sh started it
OUT=${OUT:-$PWD/build/ray-demo}
exec "${PYTHON:-python}" "$(dirname "$0")/../ray_submit.py" --address="http://127.0.0.1:$DASHBOARD_PORT" -- \
  verl-ext demo --out "$OUT" --steps "${STEPS:-2}" \
  '~ray_kwargs.ray_init.num_cpus' '~ray_kwargs.ray_init.num_gpus' '~ray_kwargs.ray_init.include_dashboard'
