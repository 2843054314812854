#!/usr/bin/env bash
# Data-parallel gradient traffic per comm.grad_dtype (fp32, bf16, int8, fp8; the 8-bit forms with
# error feedback): bytes a rank sends per step, the time a step's average was under way and the
# part left exposed, the step time, and the loss after the steps, for a ~13M dense model on
# DP ranks of this machine over MPI. The figures of bench/RESULTS.md's gradient-communication table.
# usage: bench/grad_comm.sh [RANKS (default 2)] [STEPS (default 40)]   (DSTRAIN: the executable)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dstrain=${DSTRAIN:-$root/build/dstrain}
ranks=${1:-2}
steps=${2:-40}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$dstrain" prep --output "$work/corpus.h5" --input /usr/share/common-licenses/* >/dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
printf '%-6s %14s %12s %12s %10s %10s\n' dtype "sent/step" "comm/step" exposed "s/step" loss
for dtype in fp32 bf16 int8 fp8; do
  feedback=false
  [[ $dtype == int8 || $dtype == fp8 ]] && feedback=true
  mpirun -np "$ranks" --oversubscribe "$dstrain" train --config "$root/input/tiny.ini" --run.dir "$work/$dtype" \
    --data.train "$work/corpus.h5" --model.hidden_size 512 --model.num_layers 4 --model.intermediate_size 1408 \
    --model.num_heads 8 --model.max_seq_len 128 --train.seq_len 128 --train.micro_batch 2 --train.steps "$steps" \
    --log.interval "$steps" --train.eval_interval 0 --comm.grad_dtype "$dtype" --comm.error_feedback "$feedback" \
    >"$work/$dtype.log" 2>&1 || { tail -20 "$work/$dtype.log"; exit 1; }
  python3 - "$work/$dtype" "$dtype" <<'PY'
import json, sys
run, dtype = sys.argv[1], sys.argv[2]
r = [json.loads(l) for l in open(run + "/metrics.jsonl") if '"dp_comm_bytes"' in l][-1]
print(f"{dtype:<6} {r['dp_comm_bytes'] / 1e6:11.2f} MB {r['dp_comm_s'] * 1e3:9.1f} ms {r['dp_comm_exposed_s'] * 1e3:9.1f} ms "
      f"{r['step_time_s']:10.3f} {r['loss']:10.4f}")
PY
done
