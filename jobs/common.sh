# shellcheck shell=bash
# What the dstrain job scripts share, sourced by each of them: finding dstrain, the command line
# (an INI file and --section.key value overrides, from the script's arguments or from
# DSTRAIN_CONFIG and DSTRAIN_ARGS), the run directory tied to the job's name (so that a requeued
# job continues the same run), the srun launch, and what its exit code means for a requeue.
#
# Environment a user may set:
#   DSTRAIN               the dstrain executable (default: dstrain on PATH, e.g. from its module,
#                         else build/dstrain in the submit directory)
#   DSTRAIN_CONFIG        the INI file when no argument names one
#   DSTRAIN_ARGS          overrides, before those given as arguments (which win)
#   RUN_DIR               the run directory (default: SUBMIT_DIR/runs/JOB_NAME)
#   DSTRAIN_MAX_RESTARTS  how often a job whose rank or node failed is requeued (default 3)
#   DSTRAIN_MIN_NODES     a job requeued after a rank or node failure may start again on as few as
#                         this many nodes (default: as many as it had), resuming on the smaller layout,
#                         when a lost node does not come back (as torchrun's --nnodes MIN:MAX)
#   DSTRAIN_SRUN_MPI      srun's --mpi plugin (default pmix)
#   DSTRAIN_SIGNAL_LEAD   seconds before the time limit that the script's `#SBATCH --signal=B:USR1@N`
#                         asks for (each script sets it to its N; a --signal given to sbatch needs it too)

dstrain_die() {
  echo "error: $(basename "${DSTRAIN_JOB_SCRIPT:-$0}"): $*" >&2
  exit 2
}

# dstrain_setup DEFAULT_CONFIG [CONFIG] [--section.key value ...]
dstrain_setup() {
  local default_config=$1
  shift
  [[ -n ${SLURM_JOB_ID:-} ]] ||
    dstrain_die "this is a Slurm job script: submit it with sbatch (or run it inside salloc); it starts dstrain with srun"
  local submit_dir=${SLURM_SUBMIT_DIR:-$PWD}
  if [[ -n ${DSTRAIN:-} ]]; then
    DSTRAIN_BIN=$DSTRAIN
  elif command -v dstrain >/dev/null 2>&1; then
    DSTRAIN_BIN=$(command -v dstrain)
  else
    DSTRAIN_BIN=$submit_dir/build/dstrain
  fi
  [[ -x $DSTRAIN_BIN ]] ||
    dstrain_die "no dstrain executable at '$DSTRAIN_BIN': load its module, build it (scripts/build.sh) in the submit directory, or set DSTRAIN"
  CONFIG=${DSTRAIN_CONFIG:-$default_config}
  if [[ $# -gt 0 && $1 != --* ]]; then
    CONFIG=$1
    shift
  fi
  [[ $CONFIG = /* ]] || CONFIG=$submit_dir/$CONFIG
  [[ -f $CONFIG ]] || dstrain_die "configuration file '$CONFIG' not found (first argument, or DSTRAIN_CONFIG)"
  local from_environment=()
  read -r -a from_environment <<<"${DSTRAIN_ARGS:-}"
  OVERRIDES=("${from_environment[@]}" "$@")
  RUN_DIR=${RUN_DIR:-$submit_dir/runs/${SLURM_JOB_NAME:-dstrain}}
  # Parallel HDF5 on Lustre and NFS: POSIX file locks are unsupported or slow there.
  export HDF5_USE_FILE_LOCKING=FALSE
  export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}
  [[ -z ${DSTRAIN_MIN_NODES:-} || ${DSTRAIN_MIN_NODES} =~ ^[1-9][0-9]*$ ]] ||
    dstrain_die "DSTRAIN_MIN_NODES must be a positive number of nodes, not '$DSTRAIN_MIN_NODES'"
}

# dstrain_expect_gpus N: stop with a message when a node of the job has fewer than N GPUs. A run
# told `--train.device cpu` (the same script on CPU nodes) expects none.
dstrain_expect_gpus() {
  local want=$1 have i
  for ((i = 0; i < ${#OVERRIDES[@]}; i++)); do
    [[ ${OVERRIDES[i]} == --train.device=cpu ]] && return 0
    [[ ${OVERRIDES[i]} == --train.device && ${OVERRIDES[i + 1]:-} == cpu ]] && return 0
  done
  have=$(nvidia-smi -L 2>/dev/null | wc -l)
  [[ $have -ge $want ]] || dstrain_die "expects $want GPUs per node, found $have here (nvidia-smi -L); use jobs/cpu_smoke.sh on CPU nodes"
}

# dstrain_train [srun options...] [-- script's own settings...]: runs `dstrain train` on every
# task of the job, continuing from the run's latest checkpoint (the script's settings come before
# the user's overrides, which win), then acts on its exit code:
#   0           done
#   75          checkpointed on Slurm's signal (time limit, preemption): requeue
#   5, 128+N    a rank or node failed (communication timeout, killed): requeue, at most
#               DSTRAIN_MAX_RESTARTS times; it resumes from the latest checkpoint
#   other       a real error (configuration 2, data 3, checkpoint 4, non-finite 6): stop
dstrain_train() {
  local srun_options=() settings=()
  while [[ $# -gt 0 && $1 != -- ]]; do
    srun_options+=("$1")
    shift
  done
  [[ $# -gt 0 ]] && shift
  settings=("$@")
  # The tasks of every node of this allocation: a job requeued onto fewer nodes
  # (DSTRAIN_MIN_NODES) still has its first run's task count in its environment.
  if [[ -n ${SLURM_NTASKS_PER_NODE:-} && -n ${SLURM_JOB_NUM_NODES:-} ]]; then
    local per_node=${SLURM_NTASKS_PER_NODE%%[(]*}  # "2(x2)" where Slurm lists it per node
    srun_options=(--ntasks=$((SLURM_JOB_NUM_NODES * per_node)) "${srun_options[@]}")
  fi
  local command=(srun --mpi="${DSTRAIN_SRUN_MPI:-pmix}" --kill-on-bad-exit=1 "${srun_options[@]}"
                 "$DSTRAIN_BIN" train --config "$CONFIG" --run.dir "$RUN_DIR" --ckpt.resume auto
                 "${settings[@]}" "${OVERRIDES[@]}")
  local restarts=${SLURM_RESTART_COUNT:-0} max=${DSTRAIN_MAX_RESTARTS:-3}
  echo "dstrain job $SLURM_JOB_ID (restart $restarts) on ${SLURM_JOB_NODELIST:-?}, $(date '+%F %T')"
  echo "run directory: $RUN_DIR"
  echo "+ ${command[*]}"
  # Slurm's warning before the time limit reaches this shell (--signal=B:USR1@N), which passes
  # it on to srun, and srun to every task. Slurm 22.05 sometimes sends it at once, when a job's
  # start coincides with its time-limit check (a requeued job's old end time is still on record),
  # and then never again: a warning while more than the lead remains is that one, and this shell
  # sets a timer of its own to give the warning when the lead is reached.
  # srun in a process group of its own: Slurm signals the batch shell's whole group, and a
  # warning that is not to be passed on must not reach srun (nor one that is, twice).
  # (errexit off meanwhile: bash leaves a script under set -e after a trap has interrupted wait)
  # dstrain writes its exit code to DSTRAIN_EXIT_FILE when it ends on its own: srun exits 0 also
  # when the step's tasks failed to launch, and such a run must not pass for a finished one.
  local rc=0 srun_pid
  export DSTRAIN_EXIT_FILE=$RUN_DIR/.exit-$SLURM_JOB_ID-$restarts
  mkdir -p "$RUN_DIR" && rm -f "$DSTRAIN_EXIT_FILE"
  set +e
  trap 'dstrain_forward_warning "$srun_pid"' USR1
  setsid "${command[@]}" &
  srun_pid=$!
  while true; do
    wait "$srun_pid"
    rc=$?
    kill -0 "$srun_pid" 2>/dev/null || break  # finished, rather than interrupted by the trap
  done
  trap - USR1
  set -e
  if [[ $rc -eq 0 && ! -f $DSTRAIN_EXIT_FILE ]]; then
    echo "dstrain: srun exited 0 but dstrain did not end on its own (its tasks failed to launch?):" \
      "treated as a failed node" >&2
    rc=5
  fi
  rm -f "$DSTRAIN_EXIT_FILE"
  case $rc in
    0)
      echo "dstrain: finished"
      exit 0
      ;;
    75)
      echo "dstrain: checkpointed on a signal; requeueing job $SLURM_JOB_ID"
      dstrain_requeue
      ;;
    5 | 1[3-9][0-9] | 2[0-5][0-9])
      if [[ $restarts -lt $max ]]; then
        echo "dstrain: a rank or node failed (exit code $rc); requeueing job $SLURM_JOB_ID, restart $((restarts + 1)) of $max"
        dstrain_requeue_after_failure
      fi
      echo "dstrain: a rank or node failed (exit code $rc) and the job was restarted $restarts times already: giving up" >&2
      exit "$rc"
      ;;
    *)
      echo "dstrain: stopped with exit code $rc (see the message above); not requeueing" >&2
      exit "$rc"
      ;;
  esac
}

# Seconds of a squeue time (D-HH:MM:SS, HH:MM:SS, MM:SS); empty when unknown or unlimited.
dstrain_seconds() {
  local text=$1 days=0
  [[ $text =~ ^[0-9:-]+$ ]] || return 0
  if [[ $text == *-* ]]; then
    days=${text%%-*}
    text=${text#*-}
  fi
  local total=0 part
  IFS=: read -r -a parts <<<"$text"
  for part in "${parts[@]}"; do total=$((total * 60 + 10#$part)); done
  echo $((days * 86400 + total))
}

dstrain_forward_warning() {
  local srun_pid=$1 remaining lead=${DSTRAIN_SIGNAL_LEAD:-600}
  remaining=$(dstrain_seconds "$(squeue -h -j "$SLURM_JOB_ID" -o %L 2>/dev/null || true)")
  if [[ -n $remaining && $remaining -gt $((lead + 5)) ]]; then
    echo "dstrain: early time-limit warning with ${remaining} s still to go: passing it on in $((remaining - lead)) s"
    (sleep $((remaining - lead)) && kill -USR1 $$) &
    return
  fi
  echo "dstrain: time-limit warning (${remaining:-?} s left): dstrain checkpoints and stops"
  kill -USR1 "$srun_pid" 2>/dev/null || true
}

dstrain_requeue() {
  scontrol requeue "$SLURM_JOB_ID" || dstrain_die "scontrol requeue $SLURM_JOB_ID failed: resubmit the same script with the same --job-name to continue"
  exit 0
}

# Slurm gives a requeued job the node count it last ran with, even when it was submitted with a
# range (--nodes=1-2). Where DSTRAIN_MIN_NODES allows fewer nodes, the requeued job asks for
# MIN-N nodes again (and the tasks of MIN nodes), so that it can start while a lost node is away.
dstrain_requeue_after_failure() {
  local nodes=${SLURM_JOB_NUM_NODES:-1} min=${DSTRAIN_MIN_NODES:-}
  if [[ -z $min || $min -ge $nodes ]]; then
    dstrain_requeue
  fi
  local per_node=${SLURM_NTASKS_PER_NODE:-$((${SLURM_NTASKS:-$nodes} / nodes))}
  per_node=${per_node%%[(]*}
  trap '' TERM  # the requeue ends this script; the update below must happen first
  scontrol requeue "$SLURM_JOB_ID" || dstrain_die "scontrol requeue $SLURM_JOB_ID failed: resubmit the same script with the same --job-name to continue"
  if scontrol update JobId="$SLURM_JOB_ID" NumNodes="$min-$nodes" NumTasks=$((min * per_node)); then
    echo "dstrain: the requeued job may start on $min to $nodes nodes (DSTRAIN_MIN_NODES)"
  else
    echo "dstrain: warning: could not let job $SLURM_JOB_ID start on fewer than $nodes nodes" >&2
  fi
  exit 0
}
