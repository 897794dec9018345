#!/usr/bin/env bash
# The job submit.sh runs, on the head node, in the job's copy of this checkout (Ray's working_dir; every node has the
# same copy, so the relative paths below resolve on each): check the shared paths on every node, then verl's trainer.
#   job.sh MODEL DATA RECORDS NNODES GPUS_PER_NODE [KEY=VALUE ...]    (RECORDS may be empty: no records)
set -euo pipefail
MODEL=$1 DATA=$2 RECORDS=$3 NNODES=$4 GPUS_PER_NODE=$5
shift 5
python recipes/check_shared_paths.py --model "$MODEL" --data "$DATA" ${RECORDS:+--records "$RECORDS"}
exec python -m verl.trainer.main_ppo --config-dir=configs --config-name=grpo_qwen3_sglang \
  actor_rollout_ref.model.path="$MODEL" data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" \
  actor_rollout_ref.rollout.multi_turn.function_tool_path=verl_ext/demo/tools.py \
  trainer.nnodes="$NNODES" trainer.n_gpus_per_node="$GPUS_PER_NODE" verl_ext.records.dir="${RECORDS:-null}" "$@"
