#!/usr/bin/env bash
# A two-node Ray cluster on this machine for the CPU demo: `cluster.sh start` / `cluster.sh stop`.
# Ports are distinct from Ray's defaults (RAY_PORT, DASHBOARD_PORT, ...) so it does not clash with another cluster.
# The CPU platform and the demo's forced first turn reach verl's Ray workers through the nodes' environment.
set -euo pipefail
RAY=${RAY:-ray}
RAY_PORT=${RAY_PORT:-26379}
DASHBOARD_PORT=${DASHBOARD_PORT:-28265}
BASE=${BASE_PORT:-27000}
TMP=${RAY_TMP:-/tmp/verl_ext_ray_$RAY_PORT}
export VERL_PLATFORM=cpu HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}  # a local test cluster; set up token auth for a shared one
export VERL_EXT_CPU_FORCE_FIRST_TURN="${VERL_EXT_CPU_FORCE_FIRST_TURN:-$(python -c 'from verl_ext.demo.run import FORCED_TOOL_CALL; print(FORCED_TOOL_CALL)')}"
ports() {  # per-node port ranges, so two nodes on one machine never collide
  echo --node-manager-port=$(($1)) --object-manager-port=$(($1 + 1)) --min-worker-port=$(($1 + 10)) \
    --max-worker-port=$(($1 + 400))
}
case "${1:-}" in
  start)
    # the head holds the fake GPU verl's resource pools ask for (the CPU platform maps it to the CPU)
    $RAY start --head --port="$RAY_PORT" --dashboard-port="$DASHBOARD_PORT" --include-dashboard=true \
      --dashboard-agent-listen-port=$((BASE + 500)) --metrics-export-port=$((BASE + 501)) \
      --ray-client-server-port=$((BASE + 502)) --runtime-env-agent-port=$((BASE + 503)) \
      --num-cpus=16 --num-gpus=1 --temp-dir="$TMP" $(ports "$BASE") --disable-usage-stats
    $RAY start --address="127.0.0.1:$RAY_PORT" --num-cpus=16 --num-gpus=0 \
      --dashboard-agent-listen-port=$((BASE + 600)) --metrics-export-port=$((BASE + 601)) \
      --runtime-env-agent-port=$((BASE + 603)) $(ports $((BASE + 1000))) --disable-usage-stats
    ;;
  stop)
    # `ray stop` stops every Ray process of this user on the machine: stop only this cluster's, by their session
    pids=$(pgrep -f -- "$TMP|:$RAY_PORT" || true)
    [ -n "$pids" ] && kill $pids 2>/dev/null || true
    sleep 3
    pids=$(pgrep -f -- "$TMP|:$RAY_PORT" || true)
    [ -n "$pids" ] && kill -9 $pids 2>/dev/null || true
    ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
