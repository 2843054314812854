#!/usr/bin/env bash
# DualPipeV's pairs side by side against one after the other (parallel.dualpipe_overlap): a
# V3-shaped model on dp 2 × pp 2 with its experts split over ep 2, the step time, the share of it
# spent in the expert exchange, and the share of that exchange during which the pair's other
# thread computed. The figures of bench/RESULTS.md's section on DualPipeV's overlap.
#   local:        four ranks of this machine under mpirun;
#   cluster RATE: two nodes of the cluster in miniature (tests/cluster/mini_cluster.sh), links of
#                 RATE, parallel.order pp-dp so that each expert-parallel pair of ranks spans the
#                 link (as root).
# usage: bench/dualpipe_overlap.sh [local | cluster [RATE (default 1gbit)]] [STEPS (default 12)]
#   (DSTRAIN: the executable, default build/dstrain)
set -euo pipefail
mode=${1:-local}
rate=1gbit
if [[ $mode == cluster && ${2:-} =~ bit$ ]]; then rate=$2; shift; fi
steps=${2:-12}
[[ $mode == cluster ]] && export TMPDIR=/var/tmp  # the nodes have a /tmp each
source "$(dirname "$0")/mpi_bench.sh"
prepare_corpus ""

# 16 routed experts (2 of them per token, in 4 groups), 2 shared; 8 layers, seq 256, 8 micro-batches
# of 2 sequences per rank and step.
model=(--config "$root/input/tiny-v3.ini" --data.train "$corpus" --data.valid "$corpus" --train.device cpu
       --model.hidden_size 256 --model.num_layers 8 --model.num_heads 8 --model.n_routed_experts 16
       --model.n_group 4 --model.n_shared_experts 2 --model.moe_intermediate_size 256
       --model.max_seq_len 256 --train.seq_len 256 --train.micro_batch 2 --train.global_batch 32
       --parallel.pp 2 --parallel.ep 2 --parallel.schedule dualpipev --parallel.virtual_stages 2
       --train.steps "$steps" --log.interval $((steps / 3)) --train.eval_interval 0 --train.threads 1
       --comm.timeout_s 300)

if [[ $mode == cluster ]]; then
  cluster_dir=$work/cluster
  cluster=$root/tests/cluster/mini_cluster.sh
  trap '"$cluster" stop "$cluster_dir"; rm -rf "$work"' EXIT
  "$cluster" start "$cluster_dir" 2 "$rate"
  launch() { "$cluster" head "$cluster_dir" srun --mpi=pmix -N 2 --ntasks-per-node=2 "$@"; }
  model+=(--parallel.order pp-dp)
  echo "== two nodes of two ranks, links of $rate; the expert exchange crosses the link"
else
  launch() { mpirun -np 4 --oversubscribe "$@"; }
  echo "== four ranks on this machine ($(nproc) cores)"
fi

printf '%-22s %8s %16s %8s %8s\n' "pairs" "s/step" "expert exchange" "hidden" "bubble"
for overlap in false true; do
  run=$work/run
  rm -rf "$run"
  launch "$dstrain" train "${model[@]}" --run.dir "$run" --parallel.dualpipe_overlap "$overlap" \
    >"$work/log" 2>&1 || { tail -n 30 "$work/log"; exit 1; }
  python3 - "$run/metrics.jsonl" "$overlap" <<'PY'
import json, sys
last = [json.loads(line) for line in open(sys.argv[1]) if '"step_time_s"' in line][-1]
label = "side by side" if sys.argv[2] == "true" else "one after the other"
hidden = f"{100 * last['expert_exchange_hidden']:.0f}%" if "expert_exchange_hidden" in last else "-"
print(f"{label:<22} {last['step_time_s']:8.3f} {100 * last['expert_exchange_share']:15.0f}% {hidden:>8}"
      f" {100 * last.get('pipeline_idle', 0):7.0f}%")
PY
done
