#!/usr/bin/env bash
# Installs what is missing, builds, makes the demo corpus from the license texts every Debian
# system ships (/usr/share/common-licenses), and trains input/demo.ini on 4 ranks: 2 data-parallel
# × 2 pipeline stages.
# Extra arguments are configuration overrides, e.g. scripts/demo.sh --train.steps 50
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install-deps.sh
scripts/build.sh
dstrain=${BUILD_DIR:-$root/build}/dstrain

if [[ ! -f data/demo.h5 || ! -f data/demo.valid.h5 ]]; then
  mkdir -p data
  texts=()
  for f in /usr/share/common-licenses/*; do
    [[ -L "$f" ]] || texts+=("$f")  # GPL, LGPL, GFDL are links to a versioned text
  done
  "$dstrain" prep --input "${texts[@]}" --output data/demo.h5 --valid-fraction 0.1
fi

# mpirun refuses to start as root unless told that it is meant.
if [[ $(id -u) -eq 0 ]]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
mpirun -np 4 --oversubscribe "$dstrain" train --config input/demo.ini "$@"
