#!/usr/bin/env bash
# mole serve over loopback with real clients: curl (every route, streaming
# and not, stop strings, malformed and hostile requests, API key, more
# requests than slots, a full queue, a client that disconnects, a slow
# client, SIGTERM), random hostile requests (tests/server/fuzz_http.py), the
# official openai npm client (tests/server/), and bounded KV caches.
set -euo pipefail
MOLE=${MOLE_BIN:?}
SRC=${MOLE_SOURCE_DIR:?}
T=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$T"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

"$MOLE" synth --arch mixtral --embd 64 --layers 2 --experts 4 --used 2 --ff 128 --ctx 4096 --type q8_0 \
  --vocab-from "$SRC/tests/data/conformance/tokenizer/ggml-vocab-llama-spm.gguf" --seed 3 -o "$T/m.gguf" > /dev/null

# start_server LOG ARGS...: sets PORT and SPID
start_server() {
  local log=$1
  shift
  "$MOLE" serve -m "$T/m.gguf" -t 2 --port 0 --template chatml "$@" 2> "$log" &
  SPID=$!
  PIDS+=("$SPID")
  for _ in $(seq 600); do  # up to a minute on a loaded machine
    PORT=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$log")
    [ -n "$PORT" ] && curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && return 0
    sleep 0.1
  done
  cat "$log" >&2
  fail "server did not start"
}
code() { curl -s -o "$T/body" -w "%{http_code}" "$@"; }
js() { python3 -c "import json,sys; d=json.load(open('$T/body')); print($1)"; }

start_server "$T/s1.log" --parallel 2 --max-tokens 4000
U="http://127.0.0.1:$PORT"

# routes
[ "$(code "$U/health")" = 200 ] || fail "/health"
[ "$(code "$U/v1/models")" = 200 ] && [ "$(js "d['data'][0]['object']")" = model ] || fail "/v1/models"
[ "$(code "$U/metrics")" = 200 ] && grep -q '^mole_slots 2$' "$T/body" || fail "/metrics"
[ "$(code "$U/nope")" = 404 ] && [ "$(js "d['error']['type']")" = invalid_request_error ] || fail "404 shape"
[ "$(code -X DELETE "$U/v1/models")" = 405 ] || fail "405"

# completions: shape, usage, a seed reproduces
R1=$(curl -sf "$U/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":10,"seed":5}')
R2=$(curl -sf "$U/v1/completions" -d '{"prompt":"Once upon a time","max_tokens":10,"seed":5}')
T1=$(echo "$R1" | python3 -c 'import json,sys; d=json.load(sys.stdin); assert d["object"]=="text_completion"; assert d["usage"]["completion_tokens"]<=10; print(d["choices"][0]["text"])')
T2=$(echo "$R2" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])')
[ "$T1" = "$T2" ] || fail "same seed, different text"
# the second request found its prompt in a slot's cache
echo "$R2" | python3 -c 'import json,sys; assert json.load(sys.stdin)["usage"]["prompt_tokens_details"]["cached_tokens"] > 0' ||
  fail "prefix reuse"

# chat: streaming deltas = the non-streaming text; stop strings cut it
REQ='{"messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":24,"seed":9}'
C=$(curl -sf "$U/v1/chat/completions" -d "$REQ" | python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"], end="")')
curl -sfN "$U/v1/chat/completions" -d "${REQ%\}},\"stream\":true}" > "$T/sse"
tail -n 2 "$T/sse" | grep -q '^data: \[DONE\]$' || fail "stream does not end with [DONE]"
S=$(python3 - "$T/sse" <<'PY'
import json, sys
out = ""
for line in open(sys.argv[1]):
    if line.startswith("data: ") and line.strip() != "data: [DONE]":
        out += json.loads(line[6:])["choices"][0]["delta"].get("content", "")
print(out, end="")
PY
)
[ "$S" = "$C" ] || fail "stream '$S' != '$C'"
STOP=$(python3 -c 'import sys; t=sys.argv[1]; print(t[3:5] if len(t) > 6 else "", end="")' "$C")
if [ -n "$STOP" ]; then
  J=$(python3 -c 'import json,sys; print(json.dumps({"messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":24,"seed":9,"stop":[sys.argv[1]]}))' "$STOP")
  curl -sf "$U/v1/chat/completions" -d "$J" | python3 -c '
import json, sys
d = json.load(sys.stdin); t = sys.argv[1]; s = sys.argv[2]
assert d["choices"][0]["message"]["content"] == t[:t.index(s)], d
assert d["choices"][0]["finish_reason"] == "stop"' "$C" "$STOP" || fail "stop string"
fi

# logprobs: greedy picks the best alternative; the alternatives are the
# model's best, best first, as many as asked
curl -sf "$U/v1/chat/completions" -d '{"messages":[{"role":"user","content":"Count"}],"max_tokens":12,"temperature":0,"logprobs":true,"top_logprobs":5}' |
  python3 -c '
import json, math, sys
c = json.load(sys.stdin)["choices"][0]["logprobs"]["content"]
assert len(c) > 0, c
for e in c:
    top = e["top_logprobs"]
    assert len(top) == 5, e
    lps = [t["logprob"] for t in top]
    assert lps == sorted(lps, reverse=True), lps
    assert abs(e["logprob"] - lps[0]) < 1e-6, e
    assert sum(math.exp(x) for x in lps) <= 1.0 + 1e-5, lps' || fail "logprobs"

# bad requests: each a 4xx JSON error naming the problem
bad() {  # expected-code data what
  local c
  c=$(code "$U/v1/chat/completions" --data-binary "$2")
  [ "$c" = "$1" ] || fail "$3: status $c"
  js "d['error']['message']" > /dev/null || fail "$3: no error object"
}
bad 400 '{not json' "malformed JSON"
bad 400 '[1,2]' "not an object"
bad 400 '{"messages":"hi"}' "messages not an array"
bad 400 '{"messages":[{"role":"wizard","content":"x"}]}' "unknown role"
bad 400 '{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}' "temperature type"
bad 400 '{"messages":[{"role":"user","content":"x"}],"max_tokens":-3}' "max_tokens range"
bad 400 '{"messages":[{"role":"user","content":"x"}],"stop":[1]}' "stop type"
bad 400 '{"messages":[{"role":"user","content":"x"}],"n":2}' "n > 1"
[ "$(code "$U/v1/completions" -d '{"prompt":[1,2,99999999]}')" = 400 ] || fail "token id out of range"
python3 -c 'print("{\"prompt\": \"" + "a" * 5000000 + "\"}")' > "$T/huge.json"
[ "$(code "$U/v1/completions" --data-binary @"$T/huge.json")" = 413 ] || fail "huge body"
python3 -c 'print("{\"prompt\": \"" + "word " * 20000 + "\"}")' > "$T/long.json"
[ "$(code "$U/v1/completions" --data-binary @"$T/long.json")" = 400 ] && grep -q "prompt has" "$T/body" || fail "prompt too long"
printf '\x00\xff\xfe{{{' > "$T/junk"
[ "$(code "$U/v1/completions" --data-binary @"$T/junk")" = 400 ] || fail "binary junk"

# more requests than slots: all answered
for i in $(seq 6); do
  curl -s -o "$T/many$i" -w "%{http_code}" "$U/v1/completions" -d "{\"prompt\":\"Request $i\",\"max_tokens\":40}" > "$T/many$i.code" &
done
wait $(jobs -p | grep -v "^$SPID$") 2> /dev/null || true
for i in $(seq 6); do [ "$(cat "$T/many$i.code")" = 200 ] || fail "request $i of 6: $(cat "$T/many$i.code")"; done

# a client that goes away mid-stream is cancelled and its slot freed
curl -sN "$U/v1/completions" -d '{"prompt":"long","max_tokens":3900,"stream":true}' > "$T/gone.sse" &
GP=$!
for _ in $(seq 100); do [ -s "$T/gone.sse" ] && break; sleep 0.05; done  # it is streaming
kill "$GP" 2> /dev/null || true
wait "$GP" 2> /dev/null || true
for _ in $(seq 50); do
  curl -s "$U/metrics" | grep -q '^mole_requests_total{outcome="cancelled"} [1-9]' && break
  sleep 0.1
done
curl -s "$U/metrics" | grep -q '^mole_requests_total{outcome="cancelled"} [1-9]' || fail "disconnect did not cancel"
for _ in $(seq 50); do curl -s "$U/metrics" | grep -q '^mole_requests_running 0$' && break; sleep 0.1; done
curl -s "$U/metrics" | grep -q '^mole_requests_running 0$' || fail "cancelled request still running"

# hostile clients: valid requests mutated at random (HTTP and JSON); the
# server keeps answering, with OpenAI's error shape, and stays up
python3 "$SRC/tests/server/fuzz_http.py" "$PORT" --seconds "${FUZZ_SECONDS:-12}" --seed 1 || fail "fuzz_http"
for _ in $(seq 100); do curl -s "$U/metrics" | grep -q '^mole_requests_running 0$' && break; sleep 0.1; done

# SIGTERM while a stream runs: the client's stream ends, the server exits 0
curl -sN "$U/v1/completions" -d '{"prompt":"x","max_tokens":3900,"stream":true}' > "$T/term.sse" &
CP=$!
sleep 0.3
kill -TERM "$SPID"
wait "$SPID" || fail "server exit code $? after SIGTERM"
wait "$CP" || true
grep -q "SIGTERM: stopping" "$T/s1.log" || fail "no clean stop"

# API key, full queue, slow clients
start_server "$T/s2.log" --parallel 1 --max-queue 1 --api-key s3cret --timeout 1
U="http://127.0.0.1:$PORT"
[ "$(code "$U/v1/models")" = 401 ] || fail "no key accepted"
[ "$(code -H 'Authorization: Bearer s3cre' "$U/v1/models")" = 401 ] || fail "wrong key accepted"
[ "$(code -H 'Authorization: Bearer s3cret' "$U/v1/models")" = 200 ] || fail "right key refused"
[ "$(code "$U/health")" = 200 ] || fail "/health needs no key"
K=(-H 'Authorization: Bearer s3cret')
for i in 1 2 3 4; do
  curl -s -o /dev/null -w "%{http_code}" "${K[@]}" "$U/v1/completions" -d '{"prompt":"q","max_tokens":600}' > "$T/q$i.code" &
done
wait $(jobs -p | grep -v "^$SPID$") 2> /dev/null || true
grep -q 503 "$T"/q*.code || fail "a full queue refused nothing: $(cat "$T"/q*.code)"
grep -q 200 "$T"/q*.code || fail "a full queue served nothing"
# a client that stalls longer than --timeout is dropped; one that sends slowly but steadily is served
exec 3<> "/dev/tcp/127.0.0.1/$PORT"
printf 'POST /v1/completions HTTP/1.1\r\nHost: x\r\n' >&3
sleep 2.5
timeout 2 cat <&3 > /dev/null || fail "a stalled client was not dropped"
exec 3>&-
BODY='{"prompt":"slow","max_tokens":4}'
exec 3<> "/dev/tcp/127.0.0.1/$PORT"
printf 'POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer s3cret\r\nContent-Length: %d\r\nConnection: close\r\n\r\n' ${#BODY} >&3
for ((i = 0; i < ${#BODY}; i += 8)); do printf '%s' "${BODY:$i:8}" >&3; sleep 0.2; done
timeout 10 cat <&3 > "$T/slow" || true
exec 3>&-
head -1 "$T/slow" | grep -q "200" || fail "slow but steady client: $(head -1 "$T/slow")"

# the official openai client
if command -v node > /dev/null && command -v npm > /dev/null; then
  NPM=${MOLE_NPM_DIR:-$(dirname "$MOLE")/npm-serve-test}
  if [ ! -d "$NPM/node_modules/openai" ]; then
    mkdir -p "$NPM"
    cp "$SRC/tests/server/package.json" "$SRC/tests/server/package-lock.json" "$NPM/"
    (cd "$NPM" && npm ci --no-audit --no-fund > /dev/null 2>&1) || fail "npm ci (the openai client from the npm registry)"
  fi
  cp "$SRC/tests/server/openai_client.mjs" "$NPM/"
  node "$NPM/openai_client.mjs" "$U" s3cret || fail "openai client"
else
  echo "SKIP: node/npm not installed: the openai client part did not run" >&2
fi
kill -INT "$SPID"
wait "$SPID" || fail "exit code after SIGINT"

# bounded KV caches (--kv-budget): a greedy completion alone equals mole
# run's with the same chunks (-b 16 + 3 slots = 19 tokens a step), for
# streaming, h2o (with offloaded experts) and locret; a
# conversation that goes on from all a slot holds reuses its cache after
# evictions, one that would rewind into evicted entries starts over; long
# prompts in parallel evict, are answered, and the caches stay in budget
P="The quick brown fox jumps over the lazy dog while the farmer watches from his porch and the sun sets slowly"
python3 -c 'import json,sys; print(json.dumps({"prompt": sys.argv[1], "max_tokens": 30, "temperature": 0}))' "$P" > "$T/kv.json"
python3 -c 'print("the farmer watches the river and the hills " * 40)' > "$T/text.txt"
"$MOLE" train-retain -m "$T/m.gguf" --data "$T/text.txt" --tokens 640 --seq-len 64 --window 8 --hidden 16 --batch 64 \
  --epochs 2 -t 2 -o "$T/heads.gguf" > /dev/null 2>&1 || fail "bounded: train-retain"
for pol in streaming h2o-offloaded locret; do
  BK=(--kv-budget 24 --kv-recent 8 --kv-type f32 --kv-policy "${pol%-offloaded}")
  [ "$pol" = locret ] && BK+=(--retain "$T/heads.gguf")
  [ "$pol" = h2o-offloaded ] && BK+=(--expert-budget 40%)  # experts read from disk as well
  "$MOLE" run -m "$T/m.gguf" -t 2 -b 19 "${BK[@]}" -p "$P" -n 30 --temp 0 > "$T/run.out" 2> /dev/null
  start_server "$T/s3.log" --parallel 3 -b 16 -c 512 "${BK[@]}"
  U="http://127.0.0.1:$PORT"
  curl -sf "$U/v1/completions" -d @"$T/kv.json" > "$T/kv.out" || fail "bounded $pol: completion"
  python3 - "$T/kv.out" "$T/run.out" <<'PY' || fail "bounded $pol: the server's text differs from mole run's"
import json, sys
got = json.load(open(sys.argv[1]))["choices"][0]["text"]
want = open(sys.argv[2], encoding="utf-8", errors="replace").read().rstrip("\n")
assert got == want, (got, want)
PY
  [ "$pol" = locret ] || { kill -INT "$SPID"; wait "$SPID" || fail "bounded $pol: exit code after SIGINT"; }
done
X=$(python3 -c 'print(",".join(str(100 + 7 * i) for i in range(40)))')
cached() { curl -sf "$U/v1/completions" -d "{\"prompt\":[$1],\"max_tokens\":$2}" |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["usage"]["prompt_tokens_details"]["cached_tokens"])'; }
[ "$(cached "$X" 1)" = 0 ] || fail "bounded: a first prompt found in a cache"
[ "$(cached "$X,5,6,7" 1)" = 40 ] || fail "bounded: going on from all a slot holds did not reuse it"
[ "$(cached "${X%,*,*,*,*,*,*,*,*,*,*},8,9" 1)" = 0 ] || fail "bounded: a rewind into evicted entries reused the cache"
for i in 1 2 3; do
  python3 -c 'import json,sys; print(json.dumps({"prompt": ("word%s " % sys.argv[1]) * 120, "max_tokens": 20}))' $i > "$T/long$i.json"
  curl -s -o "$T/kvl$i" -w "%{http_code}" "$U/v1/completions" --data-binary @"$T/long$i.json" > "$T/kvl$i.code" &
done
wait $(jobs -p | grep -v "^$SPID$") 2> /dev/null || true
for i in 1 2 3; do [ "$(cat "$T/kvl$i.code")" = 200 ] || fail "bounded: long prompt $i: $(cat "$T/kvl$i.code")"; done
curl -s "$U/metrics" > "$T/kv.metrics"
python3 - "$T/kv.metrics" <<'PY' || fail "bounded: metrics $(grep '^mole_kv' "$T/kv.metrics")"
import sys
m = dict(l.split()[:2] for l in open(sys.argv[1]) if l.startswith("mole_kv"))
assert int(m["mole_kv_evicted_total"]) > 0, m
assert int(m["mole_kv_entries"]) <= 3 * 24, m  # every slot within its budget
assert int(m["mole_kv_bytes"]) > 0, m
PY
if [ -n "${NPM:-}" ] && [ -d "$NPM/node_modules/openai" ]; then  # the official client against bounded slots too
  cp "$SRC/tests/server/openai_client.mjs" "$NPM/"
  node "$NPM/openai_client.mjs" "$U" none || fail "bounded: openai client"
fi
kill -INT "$SPID"
wait "$SPID" || fail "bounded: exit code after SIGINT"
"$MOLE" serve -m "$T/m.gguf" --port 0 -c 64 --kv-budget 64 2> "$T/s4.log" && fail "a budget not below -c was accepted"
grep -q "kv-budget 64 is not below the context" "$T/s4.log" || fail "budget >= -c: $(cat "$T/s4.log")"
echo "cli_serve: ok"
