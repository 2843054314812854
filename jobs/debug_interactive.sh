#!/usr/bin/env bash
# Small interactive runs for debugging: every rank's log, labelled with its rank, on the terminal.
#   jobs/debug_interactive.sh [CONFIG.ini] [--section.key value ...]
# Outside an allocation it asks for one (salloc, DSTRAIN_TASKS tasks, default 4, 30 minutes;
# DSTRAIN_SALLOC_ARGS adds options such as --gpus-per-task=1) and runs itself inside it; inside
# one (salloc, or an interactive srun --pty bash) it starts dstrain with srun right away:
#   salloc -n 4 -t 30
#   jobs/debug_interactive.sh input/tiny.ini --data.train data/demo.h5 --train.steps 10
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [[ -z ${SLURM_JOB_ID:-} ]]; then
  command -v salloc >/dev/null 2>&1 || { echo "error: debug_interactive.sh: no salloc here: run it on a Slurm login node" >&2; exit 2; }
  tasks=${DSTRAIN_TASKS:-4}
  read -r -a extra <<<"${DSTRAIN_SALLOC_ARGS:-}"
  echo "+ salloc -n $tasks -t 30 ${extra[*]} $0 $*"
  exec salloc -n "$tasks" -t 30 "${extra[@]}" "$0" "$@"
fi
DSTRAIN_JOB_SCRIPT=debug_interactive.sh
source "${DSTRAIN_JOBS_DIR:-$here}/common.sh"
RUN_DIR=${RUN_DIR:-${SLURM_SUBMIT_DIR:-$PWD}/runs/debug-$SLURM_JOB_ID}
dstrain_setup input/tiny.ini "$@"
command=(srun --mpi="${DSTRAIN_SRUN_MPI:-pmix}" --label --kill-on-bad-exit=1
         "$DSTRAIN_BIN" train --config "$CONFIG" --run.dir "$RUN_DIR" --ckpt.resume none --log.all_ranks "${OVERRIDES[@]}")
echo "+ ${command[*]}"
exec "${command[@]}"
