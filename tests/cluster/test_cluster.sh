#!/usr/bin/env bash
# The multi-node job script on the cluster in miniature (tests/cluster/mini_cluster.sh, started by
# ctest as a fixture): what ctest runs with label `cluster`.
#   test_cluster.sh reference | multinode | node_returns | node_lost | under_tmp   (in the build directory)
# Environment: DSTRAIN (the executable), DSTRAIN_SOURCE (the source tree), CLUSTER (the cluster's
# directory), WORK (a scratch directory), CORPUS and CORPUS_VALID.
#
# Every job is jobs/train_multinode.sh as a user submits it, on two nodes of two CPU ranks each:
# data parallelism inside a node (shared memory), the two pipeline stages across the nodes (TCP
# over the shaped links). `reference` trains the same run on one node under mpirun; the others
# compare with it.
set -uo pipefail
test=${1:?which test}
: "${DSTRAIN:?}" "${DSTRAIN_SOURCE:?}" "${CLUSTER:?}" "${WORK:?}" "${CORPUS:?}" "${CORPUS_VALID:?}"
export DSTRAIN
[[ $(id -u) -eq 0 ]] || { echo "SKIP: the cluster in miniature needs root"; exit 77; }
cluster=$DSTRAIN_SOURCE/tests/cluster/mini_cluster.sh
[[ ! -f $CLUSTER/skipped ]] || { echo "SKIP: $(cat "$CLUSTER/skipped")"; exit 77; }
dir=$WORK/$test
reference=$WORK/reference
rm -rf "$dir" && mkdir -p "$dir"
cd "$DSTRAIN_SOURCE"  # sbatch's submit directory: the job scripts find jobs/common.sh here

# The run: long enough that a node can be lost after its first checkpoint and well before its end.
steps=400
timeout_s=10
run=(--config input/tiny.ini --train.device cpu --train.steps "$steps" --log.interval 50 --ckpt.interval 50
     --train.eval_interval 0 --data.train "$CORPUS" --data.valid "$CORPUS_VALID")
# What the GPU script's own settings are replaced with on CPU nodes.
on_cpus=(--train.device cpu --comm.backend mpi --train.precision fp32 --comm.timeout_s "$timeout_s")

fail() {
  echo "FAIL: $*"
  for f in "$dir"/*.out; do [[ -f $f ]] && { echo "--- $f"; tail -n 40 "$f"; }; done
  exit 1
}
head_node() { "$cluster" head "$CLUSTER" "$@"; }
job_field() { head_node scontrol show job "$1" | tr ' ' '\n' | sed -n "s/^$2=//p" | head -n 1; }
summary() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1/summary.json" "$2"; }
losses() { python3 -c 'import json,sys; [print(r["step"], r["loss"]) for r in map(json.loads, open(sys.argv[1])) if "loss" in r]' "$1/metrics.jsonl"; }

# submit SBATCH-OPTIONS... : jobs/train_multinode.sh on the cluster, 2 tasks of 1 CPU per node,
# its run in $dir/run; prints the job id.
submit() {
  RUN_DIR=$dir/run head_node sbatch --parsable --output="$dir/%j.out" --job-name="mini-$test" \
    --ntasks-per-node=2 --cpus-per-task=1 --gpus-per-node=0 "$@" \
    jobs/train_multinode.sh input/tiny.ini "${run[@]:2}" "${on_cpus[@]}" || fail "sbatch refused the job"
}
wait_gone() {  # until job $1 has left the queue, requeues included
  for _ in $(seq 1 400); do
    [[ -z $(head_node squeue -h -j "$1" -o %T 2>/dev/null) ]] && return 0
    sleep 1
  done
  fail "job $1 still queued after 400 s: $(head_node squeue -j "$1")"
}
wait_for() {  # wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds
  local seconds=$1 what=$2
  shift 2
  for _ in $(seq 1 $((seconds * 5))); do "$@" && return 0; sleep 0.2; done
  fail "no $what within $seconds s"
}
node_down() { head_node sinfo -h -n "$1" -o %T 2>/dev/null | grep -q '^down'; }
link_bytes() { "$cluster" on "$CLUSTER" fabric cat "/sys/class/net/f-$1/statistics/tx_bytes"; }

# A node is lost once the run has a checkpoint: its link goes down, its slurmd and tasks are killed.
# The ranks left end within comm.timeout_s (and the time to ask the others who is silent) with exit
# code 5, naming the lost node's ranks and host, and the job script requeues the job.
lose_node2() {
  local job=$1
  wait_for 120 "checkpoint of job $job" test -f "$dir/run/checkpoints/latest"
  "$cluster" lose "$CLUSTER" node2
  local lost=$SECONDS
  wait_for 60 "message naming the lost node" grep -qE "rank [0-9]+ \(host node2\).* did not answer" "$dir/$job.out"
  grep -m 1 "did not answer" "$dir/$job.out"
  echo "the ranks left named the lost node after $((SECONDS - lost)) s (comm.timeout_s $timeout_s)"
  wait_for 60 "requeue after the lost node" grep -qs "requeueing job $job" "$dir/$job.out"
  grep -q "a rank or node failed (exit code 5)" "$dir/$job.out" || fail "the job did not end with exit code 5"
}

case $test in
  reference)
    # The same run on one node: 4 ranks under mpirun, dp 2 × pp 2 in the same order.
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 4 --oversubscribe "$DSTRAIN" train \
      "${run[@]}" --run.dir "$reference" --parallel.pp 2 --parallel.order dp-pp >"$reference.log" 2>&1 ||
      { tail -n 30 "$reference.log"; fail "the one-node run failed"; }
    ;;
  multinode)
    before=$(link_bytes node2)
    job=$(submit --nodes=2)
    wait_gone "$job"
    [[ $(job_field "$job" JobState) == COMPLETED ]] || fail "job $job ended $(job_field "$job" JobState)"
    grep -q "on node\[1-2\]" "$dir/$job.out" || fail "the job did not run on node1 and node2"
    grep -q "dp 2 × pp 2" "$dir/$job.out" || fail "the log does not show dp 2 × pp 2"
    sent=$(($(link_bytes node2) - before))
    echo "node2's link carried $sent bytes to it"
    ((sent > 1000000)) || fail "the stages did not talk over the link ($sent bytes)"
    diff <(losses "$reference") <(losses "$dir/run") || fail "the losses differ from the one-node run's"
    [[ $(summary "$dir/run" param_digest) == $(summary "$reference" param_digest) ]] ||
      fail "the final parameters differ from the one-node run's"
    ;;
  node_returns)
    # The node comes back (once Slurm has it down): the requeued job runs on both nodes again and
    # ends bitwise where the uninterrupted run ends.
    job=$(submit --nodes=2)
    lose_node2 "$job"
    wait_for 60 "node2 marked down" node_down node2
    "$cluster" restore "$CLUSTER" node2
    wait_gone "$job"
    [[ $(job_field "$job" JobState) == COMPLETED ]] || fail "job $job ended $(job_field "$job" JobState)"
    [[ $(job_field "$job" Restarts) -ge 1 ]] || fail "job $job was not requeued"
    grep -q "resuming from $dir/run/checkpoints/step_" "$dir/$job.out" || fail "the requeued job did not resume"
    [[ $(grep -c "on node\[1-2\]" "$dir/$job.out") -ge 2 ]] || fail "the requeued job did not run on both nodes"
    [[ $(summary "$dir/run" param_digest) == $(summary "$reference" param_digest) ]] ||
      fail "final parameters differ from the uninterrupted run's"
    ;;
  node_lost)
    # The node stays away: a job that may shrink to one node (DSTRAIN_MIN_NODES) continues on
    # node1 alone, on another layout (pp 1), from the latest checkpoint.
    job=$(DSTRAIN_MIN_NODES=1 submit --nodes=2)
    lose_node2 "$job"
    wait_gone "$job"
    "$cluster" restore "$CLUSTER" node2  # for the tests after this one
    [[ $(job_field "$job" JobState) == COMPLETED ]] || fail "job $job ended $(job_field "$job" JobState)"
    grep -q "resuming from $dir/run/checkpoints/step_" "$dir/$job.out" || fail "the requeued job did not resume"
    grep -q "may start on 1 to 2 nodes" "$dir/$job.out" || fail "the requeued job was not allowed fewer nodes"
    grep -q "(restart 1) on node1," "$dir/$job.out" || fail "the requeued job did not run on node1 alone"
    grep -q "dp 2 × pp 1" "$dir/$job.out" || fail "the requeued job did not run as dp 2 × pp 1"
    [[ $(cat "$dir/run/checkpoints/latest") == $(printf 'step_%08d.h5' "$steps") ]] || fail "the run did not finish"
    python3 - "$reference" "$dir/run" <<'PY' || fail "the continued run's losses strayed from the uninterrupted run's"
import json, sys
def losses(d):
    return {r["step"]: r["loss"] for r in map(json.loads, open(d + "/metrics.jsonl")) if "loss" in r}
ref, run = losses(sys.argv[1]), losses(sys.argv[2])
worst = max(abs(run[s] - ref[s]) / ref[s] for s in ref)
print(f"largest relative loss difference over {len(ref)} logged steps: {worst:.2e}")
sys.exit(0 if worst < 1e-3 else 1)
PY
    ;;
  under_tmp)
    # A cluster whose directory lies under /tmp (a checkout there, say), where each node has a /tmp
    # of its own: its nodes still see the directory, and its jobs read and write it. Beside the
    # fixture's cluster, which goes on.
    tmp_cluster=$(mktemp -d /tmp/dstrain-cluster-XXXXXX)
    trap '"$cluster" stop "$tmp_cluster"; rm -rf "$tmp_cluster"' EXIT
    "$cluster" start "$tmp_cluster" 1 none || fail "a cluster under /tmp did not start"
    echo "written on the machine" >"$tmp_cluster/marker"
    job=$("$cluster" head "$tmp_cluster" sbatch --parsable --output="$tmp_cluster/%j.out" \
          --wrap "cat $tmp_cluster/marker >$tmp_cluster/seen && hostname >>$tmp_cluster/seen") || fail "sbatch refused"
    for _ in $(seq 1 120); do
      [[ -z $("$cluster" head "$tmp_cluster" squeue -h -j "$job" -o %T 2>/dev/null) ]] && break
      sleep 0.5
    done
    [[ $(cat "$tmp_cluster/seen" 2>/dev/null) == "written on the machine"$'\n'"node1" ]] ||
      fail "the job on node1 did not see the cluster's directory under /tmp: $(cat "$tmp_cluster"/*.out 2>&1)"
    head_node sinfo -h -o %T | grep -q idle || fail "the fixture's cluster did not go on beside it"
    ;;
  *)
    echo "unknown test $test" >&2
    exit 2
    ;;
esac
echo "PASS: $test"
