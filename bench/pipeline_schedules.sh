#!/usr/bin/env bash
# Every pipeline schedule on the same model and micro-batches, on P = 2 and 4 stages of this
# machine's CPU (one thread per rank): step time, throughput, the measured bubble beside the one
# the simulator predicts from the run's own forward, backward and weight-gradient times, and those
# times. The figures of bench/RESULTS.md's pipeline schedule table.
# usage: bench/pipeline_schedules.sh [CORPUS.h5] [STEPS (default 24)]
#   (DSTRAIN: the executable, default build/dstrain; without CORPUS, the license texts are prepared)
set -euo pipefail
source "$(dirname "$0")/mpi_bench.sh"
prepare_corpus "${1:-}"
steps=${2:-24}
# 8 layers of a dense model (25.7M parameters with the head), seq 128, 8 micro-batches of 2 per step.
model=(--config "$root/input/tiny.ini" --data.train "$corpus" --data.valid "$corpus" --train.device cpu
       --model.num_layers 8 --model.hidden_size 256 --model.intermediate_size 704 --model.max_seq_len 128
       --train.seq_len 128 --train.micro_batch 2 --train.global_batch 16 --train.steps "$steps"
       --log.interval $((steps / 3)) --train.eval_interval 0 --train.threads 1 --comm.timeout_s 120)
printf '%-3s %-12s %9s %9s %9s %10s   %s\n' P schedule "s/step" "tok/s" bubble predicted "ms per action: F / B / W (mean over virtual stages)"
for pp in 2 4; do
  for schedule in 1f1b interleaved zb-h1 zbv dualpipev; do
    chunks=1
    [[ $schedule == interleaved || $schedule == zbv || $schedule == dualpipev ]] && chunks=2
    run=$work/$schedule-$pp
    mpirun -np "$pp" --oversubscribe "$dstrain" train "${model[@]}" --parallel.pp "$pp" --parallel.schedule "$schedule" \
      --parallel.virtual_stages "$chunks" --run.dir "$run" >"$work/log" 2>&1 || { cat "$work/log"; exit 1; }
    python3 - "$run/metrics.jsonl" "$pp" "$schedule" <<'PY'
import json, sys
last = [json.loads(line) for line in open(sys.argv[1]) if '"pipeline_idle"' in line][-1]
mean = lambda key: sum(last[key]) / len(last[key]) if key in last else 0.0
print(f"{sys.argv[2]:<3} {sys.argv[3]:<12} {last['step_time_s']:9.3f} {last['tokens_per_s']:9.0f} "
      f"{100 * last['pipeline_idle']:8.1f}% {100 * last['pipeline_idle_predicted']:9.1f}%   "
      f"{mean('pipeline_forward_ms'):.1f} / {mean('pipeline_backward_ms'):.1f} / {mean('pipeline_weight_ms'):.1f}")
PY
  done
done
