#!/usr/bin/env bash
# Peak memory of `dstrain ckpt import-hf` on synthetic DeepSeek-V3-shaped models in DeepSeek's FP8
# layout (bench/make_fp8_model.py), one per number of layers given, each imported in fp32 and in
# bf16 under /usr/bin/time -v, and of `export-hf --dtype fp8` of the fp32 import. Both hold one
# tensor at a time: the peak should follow the largest tensor, not the model. Everything is
# written under WORK_DIR and deleted afterwards; check `df -h` first (the fp32 checkpoint of the
# 8-layer model takes about 11 GB).
# usage: bench/fp8_import_memory.sh [WORK_DIR (default /tmp/dstrain-fp8-bench)] [LAYERS ... (default 4 8)]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dstrain=${DSTRAIN:-$root/build/dstrain}
work=${1:-/tmp/dstrain-fp8-bench}
shift || true
layers=("$@")
[[ ${#layers[@]} -gt 0 ]] || layers=(4 8)
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, $(free -g | awk '/^Mem:/ {print $2}') GiB; load: $(cut -d' ' -f1-3 /proc/loadavg)"
for n in "${layers[@]}"; do
  rm -rf "$work/model"
  echo "model: $n layers + 1 multi-token prediction layer: $(python3 "$root/bench/make_fp8_model.py" "$work/model" --layers "$n")"
  for precision in fp32 bf16; do
    /usr/bin/time -v "$dstrain" ckpt import-hf "$work/model" --train.precision "$precision" \
      --output "$work/imported.h5" >"$work/import.log" 2>"$work/time.log" ||
      { cat "$work/import.log" "$work/time.log"; exit 1; }
    echo "  $precision: $(tail -1 "$work/import.log" | cut -d';' -f1)"
    echo "    peak RSS $(awk -F': ' '/Maximum resident/ {printf "%.0f MB", $2 / 1024}' "$work/time.log")," \
         "wall $(awk -F': ' '/Elapsed/ {print $2}' "$work/time.log")," \
         "checkpoint $(du -m "$work/imported.h5" | cut -f1) MB"
    if [[ $precision == fp32 ]]; then
      /usr/bin/time -v "$dstrain" ckpt export-hf "$work/imported.h5" --dtype fp8 --output "$work/exported" \
        >"$work/export.log" 2>"$work/time.log" || { cat "$work/export.log" "$work/time.log"; exit 1; }
      echo "    export-hf --dtype fp8 of it: peak RSS $(awk -F': ' '/Maximum resident/ {printf "%.0f MB", $2 / 1024}' \
        "$work/time.log"), wall $(awk -F': ' '/Elapsed/ {print $2}' "$work/time.log"), $(du -sm "$work/exported" | cut -f1) MB"
      rm -rf "$work/exported"
    fi
    rm -f "$work/imported.h5"
  done
done
