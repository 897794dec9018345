#!/usr/bin/env bash
# Multi-node GRPO (Qwen3 + calculator tool on GSM8K, SGLang, verl_ext; job config configs/grpo_qwen3_sglang.yaml)
# as a Ray job, from any machine that reaches the head's dashboard: a laptop, a login node, the head.
#
# Every node: recipes/sglang/install.sh (verl 0.9.1 + sglang 0.5.12 + verl_ext), then a Ray cluster
# (`ray start --head` on one node, `ray start --address=HEAD:6379` on the others). Then:
#   RAY_ADDRESS=http://HEAD:8265 MODEL=/shared/models/Qwen3-4B DATA=/shared/data/gsm8k RECORDS=/shared/records \
#     NNODES=2 GPUS_PER_NODE=8 recipes/gsm8k_qwen3_sglang/submit.sh [KEY=VALUE ...]
#
# What goes where:
# - This checkout (configs/, recipes/, verl_ext/ with the calculator tool) is shipped with the job as Ray's
#   working_dir: every node gets the same copy, the job's processes start in it and import verl_ext from it.
# - MODEL, DATA and RECORDS are NOT shipped: they must be absolute paths on storage every node mounts at the same
#   path (NFS, Lustre, ...). MODEL: the model folder; DATA: train.parquet and test.parquet from prepare_data.py;
#   RECORDS (optional; unset: no records): verl_ext's per-rollout records, written by every node. The job's first
#   step checks each on every node, one line each, and stops there if one is missing (recipes/check_shared_paths.py).
# Extra KEY=VALUE arguments go to verl's trainer. The script exits with the job's terminal status: 0 only when it
# SUCCEEDED (recipes/ray_submit.py waits for it even when the log stream ends early).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
: "${RAY_ADDRESS:?the Ray dashboard address, e.g. http://head:8265}"
: "${MODEL:?the model folder, an absolute path on shared storage}" "${DATA:?the folder of train/test parquet, on shared storage}"
for path in "$MODEL" "$DATA" ${RECORDS:+"$RECORDS"}; do
  case $path in
    /*) ;;
    *) echo "submit.sh: $path is not an absolute path; MODEL, DATA and RECORDS name folders on the cluster's shared storage, the same path on every node" >&2; exit 2 ;;
  esac
done
exec "${PYTHON:-python}" "$REPO/recipes/ray_submit.py" --address="$RAY_ADDRESS" --working-dir="$REPO" \
  --exclude=tests --exclude=docs --exclude=bench --env TOKENIZERS_PARALLELISM=false -- \
  bash recipes/gsm8k_qwen3_sglang/job.sh "$MODEL" "$DATA" "${RECORDS:-}" "${NNODES:-2}" "${GPUS_PER_NODE:-8}" "$@"
