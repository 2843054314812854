#!/usr/bin/env bash
# Communication between nodes, on the cluster in miniature (tests/cluster/mini_cluster.sh): two
# nodes whose links run at RATE (tc's token bucket), one or two ranks on each. The figures of
# bench/RESULTS.md's section on it:
#   1. `dstrain bench comm` between the two nodes (one rank each), against the link's rate;
#   2. data parallelism across the link (one rank per node): the step with comm.overlap off and on,
#      the data-parallel average's time and the part of it left exposed after the backward pass,
#      for comm.grad_dtype fp32, bf16 and int8;
#   3. four ranks, dp 2 × pp 2: parallel.order dp-pp (data parallel inside a node, the stages
#      across the link) against pp-dp (the stages inside, data parallel across).
# usage: bench/cluster.sh [RATE (default 1gbit)] [STEPS (default 12)]      as root
#   (DSTRAIN: the executable, default build/dstrain)
set -euo pipefail
rate=${1:-1gbit}
steps=${2:-12}
export TMPDIR=/var/tmp  # the nodes have a /tmp each: what they share lies elsewhere
source "$(dirname "$0")/mpi_bench.sh"
prepare_corpus ""
cluster_dir=$work/cluster
cluster=$root/tests/cluster/mini_cluster.sh
trap '"$cluster" stop "$cluster_dir"; rm -rf "$work"' EXIT
"$cluster" start "$cluster_dir" 2 "$rate"
on_cluster() { "$cluster" head "$cluster_dir" srun --mpi=pmix "$@"; }

echo "== bench comm, one rank on each node, links of $rate"
on_cluster -N 2 --ntasks-per-node=1 "$dstrain" bench comm --train.device cpu --bench.max_bytes $((64 << 20)) \
  --bench.iters 5 2>&1 | grep -E '^ +[0-9]|size'

# The model of bench/dp_overlap.sh: 25.7M parameters (103 MB of fp32 gradients), seq 256,
# micro-batch 4 per rank, one micro-batch per rank and step.
model=(--config "$root/input/tiny.ini" --data.train "$corpus" --data.valid "$corpus" --train.device cpu
       --model.hidden_size 512 --model.num_layers 8 --model.num_heads 8 --model.intermediate_size 1408
       --model.max_seq_len 256 --train.seq_len 256 --train.micro_batch 4 --train.steps "$steps"
       --log.interval $((steps / 3)) --train.eval_interval 0 --train.threads 1 --comm.timeout_s 300)

# train NODES×TASKS LABEL SETTINGS...: one run; prints its last interval's figures.
train() {
  local tasks=$1 label=$2 run=$work/run
  shift 2
  rm -rf "$run"
  on_cluster -N 2 --ntasks-per-node="$tasks" "$dstrain" train "${model[@]}" --run.dir "$run" "$@" \
    >"$work/log" 2>&1 || { tail -n 30 "$work/log"; exit 1; }
  python3 - "$run/metrics.jsonl" "$label" <<'PY'
import json, sys
last = [json.loads(line) for line in open(sys.argv[1]) if '"step_time_s"' in line][-1]
comm, exposed = last.get("dp_comm_s", 0), last.get("dp_comm_exposed_s", 0)
hidden = f"{100 * (1 - exposed / comm):.0f}%" if comm else "-"
print(f"{sys.argv[2]:<34} {last['step_time_s']:8.3f} {1000 * comm:10.0f} {1000 * exposed:9.0f} {hidden:>7}"
      f" {100 * last.get('pipeline_idle', 0):7.0f}%")
PY
}
header() { printf '%-34s %8s %10s %9s %7s %8s\n' "$1" "s/step" "DP comm ms" "exposed" "hidden" "bubble"; }

echo
echo "== data parallel across the link: dp 2, one rank per node, buckets of 5 MB"
header "grad_dtype, overlap"
for dtype in fp32 bf16 int8; do
  for overlap in false true; do
    train 1 "$dtype, overlap $overlap" --train.global_batch 8 --comm.bucket_mb 5 --comm.grad_dtype "$dtype" \
      --comm.overlap "$overlap"
  done
done

echo
echo "== dp 2 × pp 2 on two nodes of two ranks: which dimension crosses the link"
header "order"
for order in dp-pp pp-dp; do
  train 2 "$order" --parallel.pp 2 --parallel.order "$order" --train.global_batch 32 --comm.bucket_mb 5
done
