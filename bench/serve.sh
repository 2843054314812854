#!/usr/bin/env bash
# dstrain serve under load: requests/s and generated tokens/s with 1, 8 and 32 clients at once
# (--max-batch equal to the clients, so that all of them decode together), each client sending
# REQUESTS greedy completions of MAX_TOKENS tokens in turn.
#   bench/serve.sh [CKPT]        (default: trains input/tiny.ini for 20 steps on a small corpus)
# Environment: DSTRAIN (build/dstrain), CLIENTS ("1 8 32"), REQUESTS (8), MAX_TOKENS (48),
# DEVICE (cpu), SERVE_ARGS (more options of dstrain serve, e.g. --model.max_seq_len).
set -euo pipefail
DSTRAIN=${DSTRAIN:-build/dstrain}
work=$(mktemp -d)
trap 'kill "$server" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"' EXIT
ckpt=${1:-}
if [[ -z $ckpt ]]; then
  cat /usr/share/common-licenses/* > "$work/text.txt"
  "$DSTRAIN" prep --input "$work/text.txt" --output "$work/corpus.h5" >/dev/null
  "$DSTRAIN" train --config input/tiny.ini --run.dir "$work/run" --data.train "$work/corpus.h5" \
    --train.device cpu --train.steps 20 --ckpt.interval 20 >/dev/null
  ckpt=$work/run/checkpoints
fi
echo "| clients | requests | tokens | seconds | requests/s | tokens/s |"
echo "|---|---|---|---|---|---|"
for clients in ${CLIENTS:-1 8 32}; do
  "$DSTRAIN" serve --ckpt "$ckpt" --port 0 --device "${DEVICE:-cpu}" --max-batch "$clients" \
    --max-queue 1024 ${SERVE_ARGS:-} 2>"$work/serve.log" &
  server=$!
  until port=$(grep -o 'http://127.0.0.1:[0-9]*' "$work/serve.log" | cut -d: -f3) && [[ -n $port ]]; do
    kill -0 "$server" || { cat "$work/serve.log"; exit 1; }
    sleep 0.1
  done
  python3 - "$port" "$clients" "${REQUESTS:-8}" "${MAX_TOKENS:-48}" <<'PY'
import http.client, json, sys, threading, time
port, clients, requests, max_tokens = (int(a) for a in sys.argv[1:])
tokens = []
def client(i):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    for r in range(requests):
        # distinct prompts; the tokens counted are those generated (the end of document may come first)
        body = {"prompt": f"Request {i}.{r}: the", "max_tokens": max_tokens, "temperature": 0}
        connection.request("POST", "/v1/completions", body=json.dumps(body))
        answer = json.loads(connection.getresponse().read())
        tokens.append(answer["usage"]["completion_tokens"])
start = time.time()
threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
for t in threads: t.start()
for t in threads: t.join()
seconds = time.time() - start
print(f"| {clients} | {len(tokens)} | {sum(tokens)} | {seconds:.2f} | {len(tokens) / seconds:.1f} | {sum(tokens) / seconds:.0f} |")
PY
  kill -TERM "$server"
  wait "$server"
done
