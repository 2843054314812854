#!/usr/bin/env bash
# The whole path in a few minutes: installs what is missing, builds, makes the demo corpus from the
# license texts every Debian system ships (/usr/share/common-licenses), trains input/demo.ini on 4
# ranks (2 data-parallel × 2 pipeline stages), evaluates its last checkpoint, generates a
# continuation from it, plots the run, and says what to open and run next.
# Extra arguments are configuration overrides, e.g. scripts/demo.sh --train.steps 1200 (which
# continues a finished demo from its checkpoint) or --run.dir runs/other.
# DSTRAIN=/path/to/dstrain runs that executable (an installed one, say) and installs and builds nothing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
if [[ -n ${DSTRAIN:-} ]]; then
  dstrain=$DSTRAIN
else
  scripts/install-deps.sh
  scripts/build.sh
  dstrain=${BUILD_DIR:-$root/build}/dstrain
fi
# Commands as a user types them from this directory (the build's path when it is elsewhere).
shown=${dstrain#"$root"/}

# The demo corpus, made again whenever what it was made from is not what is here now: the texts
# (their names, sizes and times) and dstrain's version, as data/demo.made-from records them.
texts=()
for f in /usr/share/common-licenses/*; do
  [[ -L "$f" ]] || texts+=("$f")  # GPL, LGPL, GFDL are links to a versioned text
done
made_from="$("$dstrain" --version)
$(stat -c '%n %s %Y' "${texts[@]}")"
if [[ ! -f data/demo.h5 || ! -f data/demo.valid.h5 || $(cat data/demo.made-from 2>/dev/null) != "$made_from" ]]; then
  mkdir -p data
  rm -f data/demo.made-from
  "$dstrain" prep --input "${texts[@]}" --output data/demo.h5 --valid-fraction 0.1
  printf '%s\n' "$made_from" >data/demo.made-from
fi

# The run directory: input/demo.ini's, unless an override names another.
run=runs/demo
arguments=("$@")
for ((i = 0; i < ${#arguments[@]}; ++i)); do
  case ${arguments[i]} in
    --run.dir=*) run=${arguments[i]#--run.dir=} ;;
    --run.dir) run=${arguments[i + 1]:-$run} ;;
  esac
done

# mpirun refuses to start as root unless told that it is meant.
if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
mpirun -np 4 --oversubscribe "$dstrain" train --config input/demo.ini "$@"

prompt="This program is free software"
echo
echo "== the last checkpoint on the validation text =="
"$dstrain" eval --ckpt "$run/checkpoints" --data data/demo.valid.h5
echo
echo "== what the model writes after \"$prompt\" =="
"$dstrain" generate --ckpt "$run/checkpoints" --prompt "$prompt" --max-new-tokens 160 --temperature 0.7 --top-k 20
echo
"$dstrain" plot "$run"
cat <<EOF

Open:
  $run/loss.png, lr.png, throughput.png   the run's curves
  $run/metrics.jsonl                       every logged step (and $run/summary.json, the run's summary)
  $run/checkpoints/                        its checkpoints; TensorBoard: tensorboard --logdir runs
Next:
  $shown generate --ckpt $run/checkpoints --prompt "TEXT"       continue a text of yours
  $shown eval --ckpt $run/checkpoints --data data/demo.valid.h5   evaluate the latest checkpoint
  scripts/demo.sh --train.steps 1200                                  resume this run and train it further
  $shown plot runs/*                                              compare runs in one set of plots
EOF
