#!/usr/bin/env bash
# Multi-node GRPO (Qwen3 + calculator tool on GSM8K, SGLang, verl_ext) with `ray job submit`.
# Every node: recipes/sglang/install.sh (verl 0.9.1 + sglang 0.5.12 + verl_ext), then a Ray cluster
# (`ray start --head` on one node, `ray start --address=HEAD:6379` on the others). Then, from any machine:
#   RAY_ADDRESS=http://HEAD:8265 MODEL=/models/Qwen3-4B DATA=/data/gsm8k NNODES=2 recipes/gsm8k_qwen3_sglang/submit.sh
# DATA holds train.parquet/test.parquet from prepare_data.py. Extra KEY=VALUE arguments go to verl's trainer.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
: "${RAY_ADDRESS:?the Ray dashboard address, e.g. http://head:8265}" "${MODEL:?a local model folder}" "${DATA:?folder of train/test parquet}"
ENV_JSON=$(python -c 'import json,sys; print(json.dumps({"env_vars": {"VERL_EXT_REPO": sys.argv[1], "TOKENIZERS_PARALLELISM": "false"}}))' "$REPO")
exec ray job submit --address="$RAY_ADDRESS" --runtime-env-json="$ENV_JSON" -- \
  python -m verl.trainer.main_ppo --config-path="$REPO/recipes/gsm8k_qwen3_sglang" --config-name=grpo_qwen3_sglang \
  actor_rollout_ref.model.path="$MODEL" \
  data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" \
  actor_rollout_ref.rollout.multi_turn.function_tool_path="$REPO/verl_ext/demo/tools.py" \
  trainer.nnodes="${NNODES:-2}" trainer.n_gpus_per_node="${GPUS_PER_NODE:-8}" \
  verl_ext.records.dir="${RECORDS:-$PWD/verl_ext_records}" "$@"
