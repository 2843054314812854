#!/usr/bin/env bash
# Two dstrain executables (say, a commit's and the one before it) train the same runs, and
# everything but timing must come out bitwise the same: every metrics.jsonl loss, gradient norm,
# learning rate and expert balance, the parameter digest, and the checkpoints' /model and /optim
# datasets (h5diff, exact). A refactor that must change no number is checked with it.
#
#   tests/regression/same_results.sh REFERENCE_DSTRAIN NEW_DSTRAIN [WORK_DIR]
#
# To get a reference executable of an earlier commit:
#   git worktree add /tmp/ref COMMIT && BUILD_DIR=/tmp/ref/build /tmp/ref/scripts/build.sh
# Runs dp 2 × pp 2 on 4 MPI ranks (root: allowed, oversubscribed), a few minutes on 2 cores.
set -euo pipefail
if [[ $# -lt 2 ]]; then
  sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
reference=$(realpath "$1")
new=$(realpath "$2")
work=${3:-$(mktemp -d /tmp/dstrain-same-results.XXXXXX)}
source_dir=$(cd "$(dirname "$0")/../.." && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p "$work"

corpus=$work/corpus.h5
licenses=()
for name in GPL-2 GPL-3 LGPL-2.1 Apache-2.0 MPL-2.0 Artistic GFDL-1.3 BSD; do
  licenses+=(/usr/share/common-licenses/$name)
done
"$reference" prep --output "$corpus" --valid-fraction 0.25 --input "${licenses[@]}" >"$work/prep.log"

# name, configuration, overrides
runs=(
  "tiny|input/tiny.ini|"
  "tiny-v3|input/tiny-v3.ini|"
  "tiny-v3-zero-bf16-gpipe|input/tiny-v3.ini|--optim.zero 1 --train.precision bf16 --parallel.schedule gpipe"
)

train() {  # executable, run directory, configuration, overrides...
  local exe=$1 dir=$2 config=$3
  shift 3
  mpirun -np 4 "$exe" train --config "$source_dir/$config" --parallel.pp 2 --train.threads 1 \
    --data.train "$corpus" --data.valid "$work/corpus.valid.h5" --run.dir "$dir" --ckpt.interval 10 \
    --ckpt.resume none "$@" >"$dir.log" 2>&1 || { echo "FAILED: $exe train $config $* (see $dir.log)"; return 1; }
}

# Every record's numbers but those of the clock (throughput, step time, MFU, bubble, memory).
compare_metrics() {
  python3 - "$1" "$2" <<'PY'
import json, sys
timed = {"tokens_per_s", "step_time_s", "mfu", "pipeline_idle", "memory_gib"}
def records(path):
    with open(path) as f:
        return [{k: v for k, v in json.loads(line).items() if k not in timed} for line in f]
a, b = records(sys.argv[1]), records(sys.argv[2])
if len(a) != len(b):
    sys.exit(f"{len(a)} records against {len(b)}")
for x, y in zip(a, b):
    if x != y:
        sys.exit(f"step {x.get('step')}: {x} against {y}")
print(f"  metrics.jsonl: {len(a)} records the same")
PY
}

failures=0
for run in "${runs[@]}"; do
  IFS='|' read -r name config overrides <<<"$run"
  echo "$name: $config dp 2 × pp 2 ${overrides}"
  # shellcheck disable=SC2086
  train "$reference" "$work/$name.reference" "$config" $overrides || { failures=$((failures + 1)); continue; }
  # shellcheck disable=SC2086
  train "$new" "$work/$name.new" "$config" $overrides || { failures=$((failures + 1)); continue; }
  compare_metrics "$work/$name.reference/metrics.jsonl" "$work/$name.new/metrics.jsonl" || failures=$((failures + 1))
  for step in 00000010 00000020; do
    for group in /model /optim; do
      if h5diff "$work/$name.reference/checkpoints/step_$step.h5" "$work/$name.new/checkpoints/step_$step.h5" \
        "$group" "$group" >"$work/$name.h5diff" 2>&1; then
        echo "  step_$step.h5 $group: the same bytes"
      else
        echo "  step_$step.h5 $group: DIFFERENT"; head -20 "$work/$name.h5diff"; failures=$((failures + 1))
      fi
    done
  done
  digest() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["param_digest"])' "$1"; }
  if [[ $(digest "$work/$name.reference/summary.json") == $(digest "$work/$name.new/summary.json") ]]; then
    echo "  parameter digest: the same"
  else
    echo "  parameter digest: DIFFERENT"; failures=$((failures + 1))
  fi
done
runs_checked=${#runs[@]}
echo "$((runs_checked * 6 - failures)) passed, $failures failed"
[[ $failures -eq 0 ]]
