#!/usr/bin/env bash
# How much of the data-parallel gradient average hides behind the backward pass over MPI on this
# machine's CPU: 2 and 4 ranks, buckets of 25 and 5 MB, comm.overlap off and on, and on with the
# progress thread (comm.progress_thread) off and on. The figures of bench/RESULTS.md's table.
# usage: bench/dp_overlap.sh [CORPUS.h5] [STEPS (default 12)]
#   (DSTRAIN: the executable, default build/dstrain; without CORPUS, the license texts are prepared)
set -euo pipefail
source "$(dirname "$0")/mpi_bench.sh"
prepare_corpus "${1:-}"
steps=${2:-12}
# A dense model of 25.7M parameters (103 MB of fp32 gradients), seq 256, micro-batch 4 per rank.
model=(--config "$root/input/tiny.ini" --data.train "$corpus" --data.valid "$corpus" --train.device cpu
       --model.hidden_size 512 --model.num_layers 8 --model.num_heads 8 --model.intermediate_size 1408
       --model.max_seq_len 256 --train.seq_len 256 --train.micro_batch 4 --train.steps "$steps"
       --log.interval $((steps / 3)) --train.eval_interval 0 --train.threads 1 --comm.timeout_s 120)
printf '%-5s %-6s %-8s %-8s %8s %14s %9s\n' ranks bucket overlap thread "s/step" "DP comm (ms)" "exposed"
for ranks in 2 4; do
  for bucket in 25 5; do
    for setting in "false false" "true false" "false true" "true true"; do
      read -r overlap thread <<<"$setting"
      run=$work/run
      rm -rf "$run"
      mpirun -np "$ranks" --oversubscribe "$dstrain" train "${model[@]}" --train.global_batch $((4 * ranks)) \
        --comm.bucket_mb "$bucket" --comm.overlap "$overlap" --comm.progress_thread "$thread" --run.dir "$run" \
        >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
      python3 - "$run/metrics.jsonl" "$ranks" "$bucket" "$overlap" "$thread" <<'PY'
import json, sys
last = [json.loads(line) for line in open(sys.argv[1]) if '"dp_comm_s"' in line][-1]
print(f"{sys.argv[2]:<5} {sys.argv[3] + ' MB':<6} {sys.argv[4]:<8} {sys.argv[5]:<8} {last['step_time_s']:8.3f} "
      f"{1000 * last['dp_comm_s']:14.0f} {1000 * last['dp_comm_exposed_s']:7.0f} ms")
PY
    done
  done
done
