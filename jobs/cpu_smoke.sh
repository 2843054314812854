#!/usr/bin/env bash
# A short DP 2 × PP 2 training run on CPU nodes, with checkpoints and requeue on failure: the
# same structure as the GPU job scripts, and what the tests submit.
#   sbatch jobs/cpu_smoke.sh [CONFIG.ini] [--section.key value ...]
#SBATCH --job-name=dstrain-cpu-smoke
#SBATCH --nodes=1
#SBATCH --ntasks=4
#SBATCH --cpus-per-task=1
#SBATCH --time=00:15:00
#SBATCH --signal=B:USR1@60
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
set -euo pipefail
export DSTRAIN_SIGNAL_LEAD=${DSTRAIN_SIGNAL_LEAD:-60}  # the --signal lead above
DSTRAIN_JOB_SCRIPT=cpu_smoke.sh
# sbatch runs a copy of this file: the helpers are found beside the original, in the submit
# directory, or where DSTRAIN_JOBS_DIR says.
source "${DSTRAIN_JOBS_DIR:-${SLURM_SUBMIT_DIR:-.}/jobs}/common.sh" ||
  { echo "error: jobs/common.sh not found: submit from the dstrain directory or set DSTRAIN_JOBS_DIR" >&2; exit 2; }
dstrain_setup input/tiny.ini "$@"
dstrain_train -- --train.device cpu --parallel.pp 2 --ckpt.interval 5
