#!/usr/bin/env bash
# Context parallelism on this machine's CPU: tokens/s, activation memory (measured and `dstrain
# model info`'s estimate) and the bytes a rank passes around the ring a step, for cp 1, 2 and 4 at
# seq_len 2048, where one rank's attention dominates its activations; MLA passing its latents
# against its keys and values. One thread a rank. The figures of bench/RESULTS.md's table.
#   bench/context_parallel.sh      (DSTRAIN: the executable, default build/dstrain)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dstrain=${DSTRAIN:-$root/build/dstrain}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
dense=(--config "$root/input/tiny.ini" --model.hidden_size 512 --model.intermediate_size 1408 --model.num_layers 4
       --model.num_heads 8 --model.num_kv_heads 4 --model.vocab_size 8192)
mla=(--config "$root/input/tiny-v3.ini" --model.num_nextn_predict_layers 0 --model.n_routed_experts 0
     --model.n_shared_experts 0 --model.hidden_size 512 --model.intermediate_size 1408 --model.num_layers 4
     --model.num_heads 8 --model.q_lora_rank 192 --model.kv_lora_rank 128 --model.qk_nope_head_dim 64
     --model.qk_rope_head_dim 32 --model.v_head_dim 64 --model.vocab_size 8192)
common=(--model.max_seq_len 2048 --train.seq_len 2048 --train.micro_batch 1 --train.global_batch 4
        --train.device cpu --train.threads 1)
steps=(--bench.warmup 1 --bench.steps 3)
export OMP_NUM_THREADS=1
mpirun=(mpirun --oversubscribe -x OMP_NUM_THREADS)
[[ $(id -u) == 0 ]] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
printf '%-6s %-16s %10s %12s %12s %14s\n' model layout "tok/s" measured estimate "ring/step"
run() {  # model, ranks, options...
  local model=$1 ranks=$2
  shift 2
  declare -n args=$model
  "${mpirun[@]}" -np "$ranks" "$dstrain" bench step "${args[@]}" "${common[@]}" "${steps[@]}" "$@" \
    --bench.json "$work/step.json" >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
  "$dstrain" model info --json --ranks "$ranks" "${args[@]}" "${common[@]}" "$@" >"$work/info.json"
  python3 - "$work/step.json" "$work/info.json" "$model" "$*" <<'PY'
import json, sys
step, info = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
mib = 2 ** 20
print(f"{sys.argv[3]:<6} {sys.argv[4] or 'one rank':<16} {step['tokens_per_s']:>10.0f} "
      f"{step['peak_activation_bytes'] / mib:>9.1f} MiB {info['memory_per_rank']['activations'] / mib:>8.1f} MiB "
      f"{step['cp_ring_bytes_per_step'] / mib:>10.2f} MiB")
PY
}
run dense 1
run dense 2 --parallel.cp 2
run dense 4 --parallel.cp 4
run mla 1
run mla 2 --parallel.cp 2
run mla 2 --parallel.cp 2 --parallel.cp_mla heads
run mla 4 --parallel.cp 4
