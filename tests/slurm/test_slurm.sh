#!/usr/bin/env bash
# The job scripts under a real (one-node) Slurm: what ctest runs with label `slurm`, against the
# cluster that tests/slurm/cluster.sh started (SLURM_CONF set by ctest).
#   test_slurm.sh smoke | node_failure | time_limit | launch_failure | interactive | stop_ends_only_its_own
# Environment: DSTRAIN (the executable), DSTRAIN_SOURCE (the source tree), CORPUS and
# CORPUS_VALID (prepared by the `prepare` test), WORK (a scratch directory).
set -uo pipefail
test=${1:?which test}
: "${DSTRAIN:?}" "${DSTRAIN_SOURCE:?}" "${WORK:?}" "${SLURM_CONF:?}"
export DSTRAIN SLURM_CONF
[[ $(id -u) -eq 0 ]] || { echo "SKIP: the test cluster needs root"; exit 77; }
dir=$WORK/$test
rm -rf "$dir" && mkdir -p "$dir"
cd "$DSTRAIN_SOURCE"  # sbatch's submit directory: the job scripts find jobs/common.sh here
fail() { echo "FAIL: $*"; for f in "$dir"/*.out; do [[ -f $f ]] && { echo "--- $f"; tail -n 40 "$f"; }; done; exit 1; }
data=(--data.train "$CORPUS" --data.valid "$CORPUS_VALID")

# sbatch JOB-ARGS... -- SCRIPT-ARGS...: submits jobs/cpu_smoke.sh, waits until the job has left
# the queue (requeues included), prints the job id.
submit_and_wait() {
  local sbatch_args=() job
  while [[ $1 != -- ]]; do sbatch_args+=("$1"); shift; done
  shift
  job=$(sbatch --parsable --output="$dir/%j.out" "${sbatch_args[@]}" jobs/cpu_smoke.sh "$@") || fail "sbatch refused the job"
  for _ in $(seq 1 400); do
    [[ -z $(squeue -h -j "$job" -o %T 2>/dev/null) ]] && break
    sleep 1
  done
  echo "$job"
}

job_field() { scontrol show job "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1; }
digest() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["param_digest"])' "$1/summary.json"; }

case $test in
  smoke)
    # A short DP 2 × PP 2 run under srun: it finishes, logs every step, checkpoints, verifies.
    job=$(RUN_DIR=$dir/run submit_and_wait -- "${data[@]}" --train.steps 10)
    [[ $(job_field "$job" JobState) == COMPLETED ]] || fail "job $job ended $(job_field "$job" JobState)"
    grep -q "dp 2 × pp 2" "$dir/$job.out" || fail "the log does not show the 2 x 2 layout"
    grep -q "dstrain: finished" "$dir/$job.out" || fail "the log does not end with 'finished'"
    [[ $(grep -c '"loss"' "$dir/run/metrics.jsonl") -eq 10 ]] || fail "metrics.jsonl lacks steps"
    [[ $(cat "$dir/run/checkpoints/latest") == step_00000010.h5 ]] || fail "no checkpoint of step 10"
    "$DSTRAIN" ckpt verify "$dir/run/checkpoints" || fail "the checkpoint does not verify"
    ;;
  node_failure)
    # The uninterrupted run, the same layout under mpirun.
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 4 --oversubscribe "$DSTRAIN" train \
      --config input/tiny.ini --run.dir "$dir/reference" --train.device cpu --parallel.pp 2 --ckpt.interval 50 \
      --train.steps 1500 --log.interval 250 "${data[@]}" >"$dir/reference.log" 2>&1 || fail "the reference run failed"
    # The job; once it has a checkpoint, one of its task processes is killed with SIGKILL.
    job=$(RUN_DIR=$dir/run sbatch --parsable --output="$dir/%j.out" jobs/cpu_smoke.sh "${data[@]}" \
          --train.steps 1500 --log.interval 250 --ckpt.interval 50) || fail "sbatch refused the job"
    for _ in $(seq 1 300); do [[ -f $dir/run/checkpoints/latest ]] && break; sleep 0.2; done
    victim=$(pgrep -f "dstrain train .*--run.dir $dir/run" | tail -n 1)
    [[ -n $victim ]] || fail "no task process of job $job to kill"
    kill -9 "$victim"
    echo "killed task process $victim of job $job"
    for _ in $(seq 1 400); do [[ -z $(squeue -h -j "$job" -o %T 2>/dev/null) ]] && break; sleep 1; done
    [[ $(job_field "$job" JobState) == COMPLETED ]] || fail "job $job ended $(job_field "$job" JobState)"
    [[ $(job_field "$job" Restarts) -ge 1 ]] || fail "job $job was not requeued"
    grep -q "resuming from $dir/run/checkpoints/step_" "$dir/$job.out" || fail "the requeued job did not resume"
    [[ $(digest "$dir/run") == $(digest "$dir/reference") ]] || fail "final parameters differ from the uninterrupted run"
    ;;
  time_limit)
    # One minute per run, the warning 50 s before its end: checkpoint, requeue, resume, finish.
    # slurmctld looks at time limits every 30 s, so the warning comes 10 to 40 s into a run. The
    # steps are set from the speed of a short job measured first to about 90 s of training, which
    # no run can finish before it is warned, on a slow machine or a fast one, nor when the machine
    # was busier while the speed was measured than during the run. Once the job has
    # requeued itself, its limit is raised, so the second run finishes instead of being warned again.
    RUN_DIR=$dir/speed submit_and_wait -- "${data[@]}" --train.steps 1000 --ckpt.interval 1000 \
      --train.eval_interval 0 >/dev/null
    steps=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1]))
print(max(1000, round(s["tokens_per_s"] * 90 / (s["tokens"] / s["steps"]) / 100) * 100))' "$dir/speed/summary.json") ||
      fail "the speed measurement has no summary"
    echo "training $steps steps, about 90 s here"
    job=$(DSTRAIN_SIGNAL_LEAD=50 RUN_DIR=$dir/run sbatch --parsable --output="$dir/%j.out" --time=1 --signal=B:USR1@50 \
          jobs/cpu_smoke.sh "${data[@]}" --train.steps "$steps" --log.interval $((steps / 7)) \
          --ckpt.interval $((steps / 14)) --train.eval_interval 0) || fail "sbatch refused the job"
    for _ in $(seq 1 120); do grep -qs "requeueing" "$dir/$job.out" && break; sleep 1; done
    scontrol update JobId="$job" TimeLimit=10 || fail "could not raise the time limit of job $job"
    for _ in $(seq 1 400); do [[ -z $(squeue -h -j "$job" -o %T 2>/dev/null) ]] && break; sleep 1; done
    [[ $(job_field "$job" JobState) == COMPLETED ]] || fail "job $job ended $(job_field "$job" JobState)"
    grep -q "stopped by SIGUSR1 after step" "$dir/$job.out" || fail "no checkpoint on the time-limit signal"
    grep -q "checkpointed on a signal; requeueing" "$dir/$job.out" || fail "not requeued after the signal"
    [[ $(job_field "$job" Restarts) -ge 1 ]] || fail "job $job was not requeued"
    [[ $(cat "$dir/run/checkpoints/latest") == $(printf 'step_%08d.h5' "$steps") ]] || fail "the run did not finish all $steps steps"
    ;;
  launch_failure)
    # A step whose tasks fail to launch (PMIx cannot create its directory for the step, which a
    # directory of that name left behind makes happen) ends srun with exit code 0: the script must
    # not take that for a finished run but for a failed node, which ends the job (exit code 5) once
    # its restarts are used up: none here, since the node would fail the requeued step the same way.
    pmix=$(dirname "$SLURM_CONF")/pmix
    job=$(DSTRAIN_MAX_RESTARTS=0 RUN_DIR=$dir/run sbatch --parsable --hold --output="$dir/%j.out" jobs/cpu_smoke.sh \
          "${data[@]}" --train.steps 10) || fail "sbatch refused the job"
    mkdir -p "$pmix/spmix_appdir_$(id -u)_$job.0/0"
    scontrol release "$job" || fail "could not release job $job"
    for _ in $(seq 1 400); do [[ -z $(squeue -h -j "$job" -o %T 2>/dev/null) ]] && break; sleep 1; done
    grep -q "launch failed" "$dir/$job.out" || fail "the step of job $job launched after all"
    grep -q "did not end on its own" "$dir/$job.out" || fail "a step that did not launch passed for a finished run"
    [[ $(job_field "$job" JobState) == FAILED && $(job_field "$job" ExitCode) == 5:0 ]] ||
      fail "job $job ended $(job_field "$job" JobState) with exit code $(job_field "$job" ExitCode), not FAILED with 5"
    ;;
  interactive)
    # debug_interactive.sh inside an allocation: srun with every rank's log, labelled.
    salloc -n 2 -t 5 jobs/debug_interactive.sh "${data[@]}" --train.steps 3 --run.dir "$dir/run" >"$dir/salloc.out" 2>&1 ||
      fail "debug_interactive.sh under salloc failed"
    grep -q "^0: \[rank 0\] step 3/3" "$dir/salloc.out" || fail "rank 0's log is missing"
    grep -q "^1: \[rank 1\] step 3/3" "$dir/salloc.out" || fail "rank 1's log is missing"
    ;;
  stop_ends_only_its_own)
    # The fixture's stop with a job running, beside a process that a match by name would take for
    # a job step (of the machine's own Slurm, say): the job's processes end, the other lives on.
    # The cluster then starts again for the tests after this one.
    (exec -a "slurmstepd: [4242.0]" sleep 600) &
    decoy=$!
    trap 'kill "$decoy" 2>/dev/null' EXIT
    job=$(sbatch --parsable --output="$dir/%j.out" --wrap "sleep 600") || fail "sbatch refused the job"
    # RUNNING in the queue comes before the node has started the job's processes: wait for those.
    pids=
    for _ in $(seq 1 120); do
      pids=$(scontrol listpids "$job" 2>/dev/null | awk 'NR > 1 { print $1 }')
      [[ -n $pids ]] && break
      sleep 0.5
    done
    [[ -n $pids ]] || fail "job $job has no processes after 60 s"
    for pid in $pids; do  # and the job step daemon above them
      parent=$(ps -o ppid= -p "$pid" | tr -d ' ')
      [[ $(tr '\0' ' ' <"/proc/$parent/cmdline" 2>/dev/null) == slurmstepd:* ]] && pids+=" $parent"
    done
    ended() { [[ ! -e /proc/$1 ]] || [[ $(awk '{ print $3 }' "/proc/$1/stat" 2>/dev/null) == Z ]]; }
    cluster=$(dirname "$SLURM_CONF")
    "$DSTRAIN_SOURCE/tests/slurm/cluster.sh" stop "$cluster"
    for pid in $pids; do
      for _ in $(seq 1 100); do ended "$pid" && break; sleep 0.1; done
      ended "$pid" || fail "process $pid of job $job outlived the cluster's stop"
    done
    ended "$decoy" && fail "the cluster's stop ended a process that was not its own"
    "$DSTRAIN_SOURCE/tests/slurm/cluster.sh" start "$cluster" || fail "the cluster did not start again"
    ;;
  *)
    echo "unknown test $test" >&2
    exit 2
    ;;
esac
echo "PASS: $test"
