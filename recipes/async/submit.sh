#!/usr/bin/env bash
# GRPO with partial rollouts on a GPU Ray cluster: the GSM8K job of recipes/gsm8k_qwen3_sglang (Qwen3 + calculator,
# SGLang, verl_ext; configs/grpo_qwen3_sglang.yaml) under verl's v1 trainer in `colocate_async` mode: at each batch's
# end verl aborts the rollouts still in flight, trains, updates the weights and resumes them on the new weights.
# verl_ext's loops keep every attempt of a resumed turn (its version, logprobs, split point: docs/async.md, "Trainer
# modes"). Same setup and variables as recipes/gsm8k_qwen3_sglang/submit.sh:
#   RAY_ADDRESS=http://HEAD:8265 MODEL=/shared/models/Qwen3-4B DATA=/shared/data/gsm8k RECORDS=/shared/records \
#     NNODES=2 GPUS_PER_NODE=8 recipes/async/submit.sh [KEY=VALUE ...]
# WARMUP (default 1): batches generated ahead (trainer.v1.colocate_async.num_warmup_batches); rollouts of those
# batches are the ones a weight update aborts and resumes.
# A cluster that gives rollout its own nodes runs verl's fully_async policy instead (verl.experimental.
# fully_async_policy: a separate rollout pool, weights over the nccl checkpoint engine); verl hands verl_ext's loops
# the same resume client there, which verl_ext swaps the same way. That trainer is not run by this recipe.
set -euo pipefail
exec "$(dirname "$0")/../gsm8k_qwen3_sglang/submit.sh" trainer.v1.trainer_mode=colocate_async \
  trainer.v1.colocate_async.num_warmup_batches="${WARMUP:-1}" "$@"
