#!/usr/bin/env bash
# FP8 training (train.fp8) against bf16 on the first GPU, one build and one run: a step of the 1B
# preset (4 x 2 micro-batches of 2048 tokens) for every recipe, and of DeepSeek-V2-Lite's shapes
# cut to 3 layers (1 dense, 2 MoE; as bench/grouped_experts.sh) for bf16 and blockwise. Prints
# tokens/s, the ratio to bf16, peak memory and activation memory; the JSON of each run goes to
# RESULTS_DIR when set. The log of a run whose FP8 kernel LibTorch refused says so ("emulated").
#   bench/fp8.sh     (DSTRAIN: the executable, default build/dstrain)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dstrain=${DSTRAIN:-$root/build/dstrain}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
results=${RESULTS_DIR:-$work}
dense=(--config "$root/input/deepseek-llm-1b.ini" --train.device cuda --train.precision bf16
       --bench.warmup 3 --bench.steps 10)
moe=(--config "$root/input/deepseek-v2-lite.ini" --model.num_layers 3 --train.seq_len 2048 --train.micro_batch 4
     --train.grad_accum 1 --train.global_batch 4 --train.device cuda --train.precision bf16
     --bench.warmup 3 --bench.steps 10)
printf '%-6s %-11s %10s %7s %12s %12s %s\n' model train.fp8 "tok/s" "x bf16" "peak memory" activations "(kernel)"
run() {  # run MODEL RECIPE ARGS...
  local name=$1 recipe=$2
  shift 2
  local json=$results/fp8_${name}_$recipe.json log=$work/fp8_${name}_$recipe.log
  "$dstrain" bench step "$@" --train.fp8 "$recipe" --bench.json "$json" >"$log" 2>&1 || { cat "$log"; exit 1; }
  local kernel=kernel
  grep -q "FP8 products are emulated" "$log" && kernel=emulated
  python3 - "$json" "$name" "$recipe" "$results/fp8_${name}_none.json" "$kernel" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
base = json.load(open(sys.argv[4]))["tokens_per_s"]
kernel = sys.argv[5] if r["fp8_kernel"] else "none"
print(f"{sys.argv[2]:<6} {sys.argv[3]:<11} {r['tokens_per_s']:10.0f} {r['tokens_per_s'] / base:7.3f} "
      f"{r['peak_memory_bytes'] / 2**30:8.1f} GiB {r['peak_activation_bytes'] / 2**30:8.1f} GiB ({kernel})")
PY
}
for recipe in none tensorwise rowwise blockwise; do run 1b "$recipe" "${dense[@]}"; done
for recipe in none blockwise; do run moe "$recipe" "${moe[@]}"; done
