#!/usr/bin/env bash
# N nodes × 8 GPUs: data parallelism inside each node (its 8 GPUs, over NVLink), pipeline stages
# across nodes (parallel.pp = N), as Megatron-LM lays them out (parallel.order = tp-cp-ep-dp-pp puts the
# ranks of a node in one data-parallel group).
#   sbatch --nodes=4 jobs/train_multinode.sh input/deepseek-llm-7b.ini --data.train data/my.h5
# The run directory is runs/JOB_NAME in the submit directory (RUN_DIR overrides), on a file system
# every node sees, as must be ckpt.dir. Stopping it with a checkpoint: scancel --signal=TERM JOBID.
#SBATCH --job-name=dstrain
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --time=48:00:00
#SBATCH --signal=B:USR1@900
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.out
set -euo pipefail
export DSTRAIN_SIGNAL_LEAD=${DSTRAIN_SIGNAL_LEAD:-900}  # the --signal lead above
DSTRAIN_JOB_SCRIPT=train_multinode.sh
source "${DSTRAIN_JOBS_DIR:-${SLURM_SUBMIT_DIR:-.}/jobs}/common.sh" ||
  { echo "error: jobs/common.sh not found: submit from the dstrain directory or set DSTRAIN_JOBS_DIR" >&2; exit 2; }
dstrain_setup input/deepseek-llm-7b.ini "$@"
dstrain_expect_gpus 8
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
nodes=${SLURM_JOB_NUM_NODES:-${SLURM_NNODES:-1}}
dstrain_train --cpu-bind=cores --gpu-bind=closest -- \
  --train.device cuda --comm.backend nccl --train.precision bf16 --train.threads "$OMP_NUM_THREADS" \
  --parallel.pp "$nodes" --parallel.order tp-cp-ep-dp-pp --ckpt.interval 500 --comm.timeout_s 1200
