#!/usr/bin/env bash
# Submit a harness run under verl as a Ray job: verl's GRPO trainer on CPU (the CPU demo's model, data, reward and job
# config, configs/cpu_demo.yaml) with verl_ext's `gateway` preset, so verl_ext_gateway_agent runs a harness per row
# through the token-keeping gateway (`verl-ext demo --loop gateway`). Streams the job's log and exits with its
# terminal status (0 only when it SUCCEEDED; recipes/ray_submit.py), on the two-node cluster of recipes/cpu_demo:
#   recipes/cpu_demo/cluster.sh start && recipes/agent_harness/submit.sh; recipes/cpu_demo/cluster.sh stop
# The harness: HARNESS=module:function (default verl_ext.demo.harness:run, a ReAct calculator agent on the openai SDK),
# or HARNESS_COMMAND='python -m my_agent' (run per row with OPENAI_BASE_URL and OPENAI_API_KEY set). Yours must import
# (or its program exist) on every node: install it there, or put its folder on PYTHONPATH before `cluster.sh start`.
# The driver checks it before training starts and stops the job with one line if it cannot run. Extra KEY=VALUE
# arguments go to verl's trainer. Both nodes run on this machine, so OUT (model, data, records, report) is on storage
# both see.
set -euo pipefail
DASHBOARD_PORT=${DASHBOARD_PORT:-28265}
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}  # as cluster.sh started it
OUT=${OUT:-$PWD/build/ray-agent-harness}
if [ -n "${HARNESS_COMMAND:-}" ]; then
  case $HARNESS_COMMAND in
    *"'"*) echo "submit.sh: HARNESS_COMMAND holds a single quote; use double quotes inside it" >&2; exit 2 ;;
  esac
  harness=("verl_ext.harness.function=null" "verl_ext.harness.command='$HARNESS_COMMAND'")
else
  harness=("verl_ext.harness.function=${HARNESS:-verl_ext.demo.harness:run}")
fi
# The trainer joins the cluster (RAY_ADDRESS), so the demo's own local-Ray settings are removed from its config.
exec "${PYTHON:-python}" "$(dirname "$0")/../ray_submit.py" --address="http://127.0.0.1:$DASHBOARD_PORT" -- \
  verl-ext demo --loop gateway --out "$OUT" --steps "${STEPS:-2}" \
  '~ray_kwargs.ray_init.num_cpus' '~ray_kwargs.ray_init.num_gpus' '~ray_kwargs.ray_init.include_dashboard' \
  "${harness[@]}" "$@"
