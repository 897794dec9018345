#!/usr/bin/env bash
# The same trainer mode on the two-node CPU cluster of recipes/cpu_demo, as a Ray job: `verl-ext demo --trainer
# colocate-async --loop all` (verl's v1 trainer, trainer.v1.trainer_mode=colocate_async, the CPU engine, rows
# routed to verl_ext_tool_agent, verl_ext_audited_tool_agent and verl_ext_gateway_agent). The CPU engine holds one
# request per weight version after a few ids until verl's abort (a demo-only hook), so every step resumes a turn:
#   recipes/cpu_demo/cluster.sh start && recipes/async/submit_cpu.sh; recipes/cpu_demo/cluster.sh stop
# Streams the job's log and exits with its terminal status (0 only when it SUCCEEDED). Extra KEY=VALUE arguments go
# to verl's trainer. Both nodes run on this machine, so OUT (model, data, records, report) is on storage both see.
set -euo pipefail
DASHBOARD_PORT=${DASHBOARD_PORT:-28265}
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}  # as cluster.sh started it
OUT=${OUT:-$PWD/build/ray-async}
# The trainer joins the cluster (RAY_ADDRESS), so the demo's own local-Ray settings are removed from its config.
exec "${PYTHON:-python}" "$(dirname "$0")/../ray_submit.py" --address="http://127.0.0.1:$DASHBOARD_PORT" -- \
  verl-ext demo --trainer colocate-async --loop all --out "$OUT" --steps "${STEPS:-2}" \
  '~ray_kwargs.ray_init.num_cpus' '~ray_kwargs.ray_init.num_gpus' '~ray_kwargs.ray_init.include_dashboard' "$@"
