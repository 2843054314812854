#!/usr/bin/env bash
# Activation memory and step time of each train.recompute mode (none, selective, full) beside
# `dstrain model info`'s estimate: the figures of bench/RESULTS.md's recomputation table.
#   bench/recompute.sh [THREADS]  a ~100M dense model and a ~100M DeepSeek-V3-shaped one at seq 512
#                                 on this machine's CPU in fp32, THREADS each (default 2)
#   bench/recompute.sh gpu        the 1B preset as it is (bf16, 4 x 2048 tokens a micro-batch) on
#                                 the first GPU, its peak from LibTorch's device statistics
# (DSTRAIN: the executable, default build/dstrain)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dstrain=${DSTRAIN:-$root/build/dstrain}
target=${1:-2}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dense=(--config "$root/input/deepseek-llm-1b.ini" --model.num_layers 12 --model.hidden_size 768
       --model.intermediate_size 2048 --model.num_heads 12 --model.num_kv_heads 12 --model.vocab_size 32000)
v3=(--config "$root/input/tiny-v3.ini" --model.num_layers 8 --model.hidden_size 512 --model.intermediate_size 1408
    --model.num_heads 8 --model.q_lora_rank 192 --model.kv_lora_rank 128 --model.qk_nope_head_dim 64
    --model.qk_rope_head_dim 32 --model.v_head_dim 64 --model.n_routed_experts 16 --model.num_experts_per_tok 4
    --model.moe_intermediate_size 256 --model.vocab_size 32000 --model.max_seq_len 512)
common=(--train.seq_len 512 --train.micro_batch 1 --train.grad_accum 1 --train.precision fp32 --optim.warmup_steps 0)
gpu_1b=(--config "$root/input/deepseek-llm-1b.ini" --train.grad_accum 1)
models=(dense v3) device=(--train.device cpu --train.threads "$target") steps=(--bench.warmup 1 --bench.steps 2)
step_tokens=512
if [[ $target == gpu ]]; then
  models=(gpu_1b) common=() device=(--train.device cuda) steps=(--bench.warmup 3 --bench.steps 5) step_tokens=$((4 * 2048))
fi
printf '%-6s %-9s %12s %12s %10s %8s %10s\n' model recompute measured estimate "s/step" rerun params
for model in "${models[@]}"; do
  declare -n args=$model
  for mode in none selective full; do
    "$dstrain" bench step "${args[@]}" "${common[@]}" --train.recompute "$mode" "${device[@]}" "${steps[@]}" \
      --bench.json "$work/step.json" >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
    "$dstrain" model info --json "${args[@]}" "${common[@]}" --train.recompute "$mode" "${device[@]}" >"$work/info.json"
    python3 - "$work/step.json" "$work/info.json" "$model" "$mode" "$step_tokens" <<'PY'
import json, sys
step, info = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
mib = 2 ** 20
tokens = int(sys.argv[5])  # a step's
seconds = tokens / step['tokens_per_s']
# The reruns' share of the step, measured inside it (host time: on a GPU only their queueing).
rerun = f"{100 * step['rerun_s_per_step'] / seconds:7.1f}%" if sys.argv[3] != "gpu_1b" else f"{'-':>8}"
print(f"{sys.argv[3]:<6} {sys.argv[4]:<9} {step['peak_activation_bytes'] / mib:9.1f} MiB "
      f"{info['memory_per_rank']['activations'] / mib:9.1f} MiB {seconds:10.2f} {rerun} "
      f"{step['params'] / 1e6:8.1f} M")
PY
  done
done
