#!/usr/bin/env bash
# Run verl 0.9.1's real GRPO trainer (python -m verl.trainer.main_ppo) on CPU: 2 steps, batch 2, n=2, multi-turn
# tool calling with verl's stock tool_agent loop, the verl_ext_cpu rollout backend and a tiny random Qwen3 model.
# Prints the wall time and the peak host memory used during the run. See docs/cpu-engine.md.
#
#   scripts/run_cpu_grpo.sh [extra hydra overrides...]     (OUT=build/cpu_demo by default; log in $OUT/run.log)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-build/cpu_demo}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")

export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# verl_ext's plugin registers the cpu platform (gloo, cpu device, FSDP engines for cpu) when this is set.
export VERL_PLATFORM=cpu
# TEST/DEMO ONLY: a random model never calls a tool, so the CPU engine teacher-forces this text as every
# trajectory's first assistant turn (logprobs still the model's). Never set it in a real run.
export VERL_EXT_CPU_FORCE_FIRST_TURN=${VERL_EXT_CPU_FORCE_FIRST_TURN-'<tool_call>
{"name": "calculator", "arguments": {"expression": "12 * 7"}}
</tool_call><|im_end|>'}

"$PY" scripts/unpack_tokenizers.py >/dev/null
[ -f "$OUT/tiny-qwen3/config.json" ] || "$PY" -m verl_ext.demo.model --tokenizer build/tokenizers/qwen3 --out "$OUT/tiny-qwen3"
"$PY" -m verl_ext.demo.data --out "$OUT/data" >/dev/null

overrides=(
  algorithm.adv_estimator=grpo
  algorithm.use_kl_in_reward=false
  data.train_files="$OUT/data/train.parquet"
  data.val_files="$OUT/data/val.parquet"
  data.train_batch_size=2
  data.max_prompt_length=512
  data.max_response_length=96
  data.dataloader_num_workers=0
  actor_rollout_ref.model.path="$OUT/tiny-qwen3"
  # packs the batch without padding: fewer tokens through the 151k-vocab head, the CPU run's main cost
  actor_rollout_ref.model.use_remove_padding=true
  actor_rollout_ref.model.enable_gradient_checkpointing=false
  # flash_attention_2 is verl's default and is not installed on CPU
  +actor_rollout_ref.model.override_config.attn_implementation=sdpa
  # FSDP1 insists on GPU-resident parameters (sync_module_states); FSDP2 runs on gloo
  actor_rollout_ref.actor.strategy=fsdp2
  actor_rollout_ref.actor.fsdp_config.strategy=fsdp2
  actor_rollout_ref.actor.ppo_mini_batch_size=2
  # one sequence at a time: the fp32 logits of a 151k vocabulary dominate memory (4 GB at 4 per micro-batch)
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1
  actor_rollout_ref.actor.use_kl_loss=false
  actor_rollout_ref.actor.use_torch_compile=false
  actor_rollout_ref.actor.optim.lr=1e-3
  # a random model earns reward 0 on every sample, so GRPO advantages are 0; the entropy bonus keeps a gradient
  actor_rollout_ref.actor.entropy_coeff=0.01
  actor_rollout_ref.rollout.name=verl_ext_cpu
  actor_rollout_ref.rollout.n=2
  actor_rollout_ref.rollout.tensor_model_parallel_size=1
  actor_rollout_ref.rollout.calculate_log_probs=true
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1
  actor_rollout_ref.rollout.prompt_length=512
  actor_rollout_ref.rollout.response_length=96
  actor_rollout_ref.rollout.agent.num_workers=1
  actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent
  actor_rollout_ref.rollout.multi_turn.enable=true
  actor_rollout_ref.rollout.multi_turn.format=hermes
  actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2
  actor_rollout_ref.rollout.multi_turn.function_tool_path="$PWD/verl_ext/demo/tools.py"
  reward.custom_reward_function.path="$PWD/verl_ext/demo/reward.py"
  reward.num_workers=1
  trainer.device=cpu
  trainer.n_gpus_per_node=1
  trainer.nnodes=1
  trainer.logger=[console]
  trainer.total_training_steps=2
  trainer.val_before_train=false
  trainer.test_freq=-1
  trainer.save_freq=-1
  trainer.default_local_dir="$OUT/checkpoints"
  hydra.run.dir="$OUT/hydra"
  # one TransferQueue storage unit instead of 8 processes (the v1 trainer's default data path)
  transfer_queue.backend.SimpleStorage.num_data_storage_units=1
  # TransferQueue's storage units and its controller each ask Ray for a CPU: oversubscribe the 2 real cores.
  ray_kwargs.ray_init.num_cpus=32
  # verl's resource pools always ask for GPUs; the cpu platform maps them to these fake Ray "GPU" resources.
  +ray_kwargs.ray_init.num_gpus=1
  # the dashboard is about ten processes and 1 GB of RAM nobody looks at here
  +ray_kwargs.ray_init.include_dashboard=false
)

# Peak host memory: sample (MemTotal - MemAvailable) while the trainer runs, report it above the starting level.
used_kib() { awk '/^MemTotal:/{t=$2} /^MemAvailable:/{a=$2} END{print t-a}' /proc/meminfo; }
baseline=$(used_kib)
peak_file="$OUT/peak_kib"
echo "$baseline" >"$peak_file"
( peak=$baseline; while sleep 0.5; do u=$(used_kib); if [ "$u" -gt "$peak" ]; then peak=$u; echo "$peak" >"$peak_file"; fi; done ) &
sampler=$!
trap 'kill "$sampler" 2>/dev/null || true' EXIT

start=$(date +%s.%N)
set +e
"$PY" -m verl.trainer.main_ppo "${overrides[@]}" "$@" 2>&1 | tee "$OUT/run.log"
rc=${PIPESTATUS[0]}
set -e
end=$(date +%s.%N)
kill "$sampler" 2>/dev/null || true
peak=$(cat "$peak_file")
awk -v s="$start" -v e="$end" -v p="$peak" -v b="$baseline" -v rc="$rc" 'BEGIN{
  printf "run_cpu_grpo: rc=%d wall=%.1fs peak host memory used=%.2f GiB (%.2f GiB above the %.2f GiB baseline)\n",
         rc, e-s, p/1048576, (p-b)/1048576, b/1048576 }' | tee -a "$OUT/run.log"
exit "$rc"
