#!/usr/bin/env bash
# The routed experts' products as one grouped kernel (train.grouped_experts = true, LibTorch's
# aten::_grouped_mm) against one product per expert (false), on the first GPU in bf16: a step of
# DeepSeek-V2-Lite's shapes (64 routed experts, 6 a token, 2 shared) cut to 3 layers (1 dense,
# 2 MoE), 4 x 2048 tokens a micro-batch. Each expert gets ~770 rows a micro-batch on average.
#   bench/grouped_experts.sh     (DSTRAIN: the executable, default build/dstrain)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dstrain=${DSTRAIN:-$root/build/dstrain}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
model=(--config "$root/input/deepseek-v2-lite.ini" --model.num_layers 3 --train.seq_len 2048 --train.micro_batch 4
       --train.grad_accum 1 --train.global_batch 4 --train.device cuda --train.precision bf16 --optim.warmup_steps 0
       --bench.warmup 3 --bench.steps 10)
printf '%-16s %10s %8s %12s %s\n' grouped_experts "tok/s" "s/step" "peak memory" "(kernel used)"
# Twice each, alternating, so the spread between runs of one setting shows beside the difference.
for round in 1 2; do
  for grouped in true false; do
    json=$work/grouped_experts_${grouped}_$round.json
    "$dstrain" bench step "${model[@]}" --train.grouped_experts "$grouped" --bench.json "$json" \
      >"$work/grouped_experts_${grouped}_$round.log" 2>&1 || { cat "$work/grouped_experts_${grouped}_$round.log"; exit 1; }
    python3 - "$json" "$grouped" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]:<16} {r['tokens_per_s']:10.0f} {8192 / r['tokens_per_s']:8.3f} "
      f"{r['peak_memory_bytes'] / 2**30:9.1f} GiB ({r['grouped_experts']})")
PY
  done
done
