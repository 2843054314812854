#!/usr/bin/env bash
# One node with 8 GPUs (A100 or H100): 8 data-parallel ranks over NCCL, bf16, checkpoints every
# 500 steps, requeued after Slurm's warning before the time limit or after a rank failure.
#   sbatch jobs/train_8xA100.sh [CONFIG.ini] [--section.key value ...]
#   sbatch --job-name=my-run jobs/train_8xA100.sh input/deepseek-llm-1b.ini --data.train data/my.h5
# The run directory is runs/JOB_NAME in the submit directory (RUN_DIR overrides): a requeued or
# resubmitted job of the same name continues the same run from its latest checkpoint.
#
# Stopping it with a checkpoint: scancel --signal=TERM JOBID (every rank hears it at once).
#
# Without Slurm's srun, the same run under Open MPI's launcher:
#   mpirun -np 8 --bind-to numa --map-by numa --mca odls_base_sigkill_timeout 120 \
#     build/dstrain train --config CONFIG --ckpt.resume auto ...
# stopped with a checkpoint by `kill -USR1 MPIRUN_PID` (Open MPI forwards SIGUSR1 to every rank at
# once); a plain SIGTERM to mpirun reaches the ranks only after the sigkill timeout, which must
# then leave them time for a step and a save (docs/checkpoints.md).
#SBATCH --job-name=dstrain
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
# SIGUSR1 ten minutes before the time limit: enough to finish a step and write a checkpoint.
#SBATCH --signal=B:USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
set -euo pipefail
export DSTRAIN_SIGNAL_LEAD=${DSTRAIN_SIGNAL_LEAD:-600}  # the --signal lead above
DSTRAIN_JOB_SCRIPT=train_8xA100.sh
source "${DSTRAIN_JOBS_DIR:-${SLURM_SUBMIT_DIR:-.}/jobs}/common.sh" ||
  { echo "error: jobs/common.sh not found: submit from the dstrain directory or set DSTRAIN_JOBS_DIR" >&2; exit 2; }
dstrain_setup input/deepseek-llm-1b.ini "$@"
dstrain_expect_gpus 8
# NCCL: fail fast and say why, rather than hang; the InfiniBand and NVLink choices are NCCL's own.
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
# Each task on the cores next to its GPU; dstrain takes the GPU of its node-local rank.
dstrain_train --cpu-bind=cores --gpu-bind=closest -- \
  --train.device cuda --comm.backend nccl --train.precision bf16 --train.threads "$OMP_NUM_THREADS" \
  --ckpt.interval 500 --comm.timeout_s 900
