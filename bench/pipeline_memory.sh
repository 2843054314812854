#!/usr/bin/env bash
# Activation memory on 2 pipeline stages, measured against `dstrain model info`'s estimate, for
# each schedule and train.recompute mode: the ~100M dense model of bench/recompute.sh at seq 512,
# 4 micro-batches of 1 per step. The measured figure is summary.json's peak_activation_bytes (the
# largest over the ranks), the estimate model info's for the stage that holds the most. The
# figures of bench/RESULTS.md's table on it.
# usage: bench/pipeline_memory.sh [CORPUS.h5]     (DSTRAIN: the executable, default build/dstrain)
set -euo pipefail
source "$(dirname "$0")/mpi_bench.sh"
prepare_corpus "${1:-}"
dense=(--config "$root/input/deepseek-llm-1b.ini" --model.num_layers 12 --model.hidden_size 768
       --model.intermediate_size 2048 --model.num_heads 12 --model.num_kv_heads 12 --model.vocab_size 32000)
common=(--train.seq_len 512 --train.micro_batch 1 --train.global_batch 4 --train.grad_accum 4
        --train.precision fp32 --optim.warmup_steps 0 --parallel.pp 2)
printf '%-10s %-9s %12s %12s %9s\n' schedule recompute measured estimate ratio
for schedule in 1f1b zb-h1 zbv dualpipev; do
  chunks=1
  [[ $schedule == zbv || $schedule == dualpipev ]] && chunks=2
  for mode in none selective full; do
    settings=("${dense[@]}" "${common[@]}" --parallel.schedule "$schedule" --parallel.virtual_stages "$chunks"
              --train.recompute "$mode")
    rm -rf "$work/run"
    mpirun -np 2 --oversubscribe "$dstrain" train "${settings[@]}" --train.device cpu --train.threads 1 \
      --train.steps 2 --train.eval_interval 0 --data.train "$corpus" --data.valid "$corpus" --run.dir "$work/run" \
      >"$work/log" 2>&1 || { tail -n 30 "$work/log"; exit 1; }
    "$dstrain" model info --json "${settings[@]}" --ranks 2 >"$work/info.json"
    python3 - "$work/run/summary.json" "$work/info.json" "$schedule" "$mode" <<'PY'
import json, sys
measured = json.load(open(sys.argv[1]))["peak_activation_bytes"] / 2**20
estimate = json.load(open(sys.argv[2]))["memory_per_rank"]["activations"] / 2**20
print(f"{sys.argv[3]:<10} {sys.argv[4]:<9} {measured:8.1f} MiB {estimate:8.1f} MiB {estimate / measured:9.2f}")
PY
  done
done
