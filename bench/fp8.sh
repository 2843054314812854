#!/usr/bin/env bash
# FP8 training (train.fp8) against bf16, one build and one run, beside `dstrain model info`'s plan.
#   bench/fp8.sh       on the first GPU: a step of the 1B preset (4 x 2 micro-batches of 2048
#                      tokens) for every recipe, and of DeepSeek-V2-Lite's shapes cut to 3 layers
#                      (1 dense, 2 MoE; as bench/grouped_experts.sh) for bf16 and blockwise
#   bench/fp8.sh cpu   on this machine's CPU (the emulation, one thread): a dense 4-layer model of
#                      hidden 768 and a V3-shaped 8-layer one of hidden 512 at seq 512, every recipe
# Prints tokens/s, the ratio to bf16, peak memory, the activations measured and planned, and the
# FP8 weight copies planned and what a step kept beyond bf16's; the JSON of each run goes to
# RESULTS_DIR when set. The log of a run whose FP8 kernel LibTorch refused says so ("emulated").
# (DSTRAIN: the executable, default build/dstrain)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dstrain=${DSTRAIN:-$root/build/dstrain}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
results=${RESULTS_DIR:-$work}
if [[ ${1:-gpu} == cpu ]]; then
  first=(--config "$root/input/deepseek-llm-1b.ini" --model.num_layers 4 --model.hidden_size 768
         --model.intermediate_size 2048 --model.num_heads 12 --model.num_kv_heads 12 --model.vocab_size 32000
         --train.seq_len 512 --train.micro_batch 1 --train.grad_accum 1 --train.device cpu --train.threads 1)
  second=(--config "$root/input/tiny-v3.ini" --model.num_layers 8 --model.hidden_size 512
          --model.intermediate_size 1408 --model.num_heads 8 --model.q_lora_rank 192 --model.kv_lora_rank 128
          --model.qk_nope_head_dim 64 --model.qk_rope_head_dim 32 --model.v_head_dim 64
          --model.n_routed_experts 16 --model.num_experts_per_tok 4 --model.moe_intermediate_size 256
          --model.vocab_size 32000 --model.max_seq_len 512 --train.seq_len 512 --train.micro_batch 1
          --train.grad_accum 1 --train.device cpu --train.threads 1)
  names=(dense v3) second_recipes=(none tensorwise rowwise blockwise) steps=(--bench.warmup 1 --bench.steps 2)
else
  first=(--config "$root/input/deepseek-llm-1b.ini" --train.device cuda)
  second=(--config "$root/input/deepseek-v2-lite.ini" --model.num_layers 3 --train.seq_len 2048
          --train.micro_batch 4 --train.grad_accum 1 --train.global_batch 4 --train.device cuda)
  names=(1b moe) second_recipes=(none blockwise) steps=(--bench.warmup 3 --bench.steps 10)
fi
printf '%-6s %-11s %10s %7s %11s %23s %23s %s\n' model train.fp8 "tok/s" "x bf16" "peak memory" \
  "activations (planned)" "FP8 copies (planned)" "(kernel)"
run() {  # run NAME RECIPE MODEL-ARGS...
  local name=$1 recipe=$2
  shift 2
  local json=$results/fp8_${name}_$recipe.json log=$work/fp8_${name}_$recipe.log
  local model=("$@" --train.precision bf16 --train.fp8 "$recipe")
  "$dstrain" bench step "${model[@]}" "${steps[@]}" --bench.json "$json" >"$log" 2>&1 || { cat "$log"; exit 1; }
  "$dstrain" model info --json "${model[@]}" >"$work/plan.json"
  local kernel=kernel
  grep -q "FP8 products are emulated" "$log" && kernel=emulated
  python3 - "$json" "$work/plan.json" "$name" "$recipe" "$results/fp8_${name}_none.json" "$kernel" <<'PY'
import json, sys
r, plan = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))["memory_per_rank"]
base = json.load(open(sys.argv[5]))
kernel = sys.argv[6] if r["fp8_kernel"] else "none"
mib = 2 ** 20
kept = (r["step_kept_bytes"] - base["step_kept_bytes"]) / mib
speed = r["tokens_per_s"] / base["tokens_per_s"]
print(f"{sys.argv[3]:<6} {sys.argv[4]:<11} {r['tokens_per_s']:10.0f} {speed:7.3f} "
      f"{r['peak_memory_bytes'] / mib:7.0f} MiB {r['peak_activation_bytes'] / mib:9.1f} "
      f"({plan['activations'] / mib:9.1f}) {kept:9.1f} ({plan['fp8_weight_copies'] / mib:9.1f}) MiB ({kernel})")
PY
}
for recipe in none tensorwise rowwise blockwise; do run "${names[0]}" "$recipe" "${first[@]}"; done
for recipe in "${second_recipes[@]}"; do run "${names[1]}" "$recipe" "${second[@]}"; done
