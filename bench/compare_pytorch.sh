#!/usr/bin/env bash
# Runs dstrain and the PyTorch reference (eager and torch.compile) on this machine's GPU with the
# same model, batch and sequence length, then prints tokens/s, MFU and memory of each and the ratio.
#   bench/compare_pytorch.sh [CONFIG] [--section.key value ...]   (default: input/deepseek-llm-1b.ini)
# DSTRAIN names the executable (default build/dstrain); RESULTS_DIR receives the JSON figures.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
config=${1:-$root/input/deepseek-llm-1b.ini}
[[ $# -gt 0 ]] && shift
dstrain=${DSTRAIN:-$root/build/dstrain}
results=${RESULTS_DIR:-$(mktemp -d)}
mkdir -p "$results"
"$dstrain" bench step --config "$config" --bench.json "$results/dstrain.json" "$@"
python3 "$root/bench/pytorch_reference.py" --config "$config" --json "$results/eager.json"
python3 "$root/bench/pytorch_reference.py" --config "$config" --compile --json "$results/compiled.json" ||
  echo "torch.compile reference failed; its row is missing" >&2
python3 - "$results" <<'PY'
import json, os, sys
results = sys.argv[1]
def load(name):
    path = os.path.join(results, name)
    return json.load(open(path)) if os.path.exists(path) else None
rows = [("dstrain", load("dstrain.json")), ("pytorch eager", load("eager.json")), ("pytorch compiled", load("compiled.json"))]
base = rows[1][1]["tokens_per_s"] if rows[1][1] else None
print(f"{'':18} {'tokens/s':>10} {'MFU':>7} {'memory':>10} {'vs eager':>9}")
for name, r in rows:
    if not r:
        continue
    ratio = f"{r['tokens_per_s'] / base:.3f}x" if base else "-"
    print(f"{name:18} {r['tokens_per_s']:10.0f} {100 * r['mfu']:6.1f}% {r['peak_memory_bytes'] / 2**30:8.1f}GiB {ratio:>9}")
PY
