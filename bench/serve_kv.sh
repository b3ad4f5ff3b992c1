#!/usr/bin/env bash
# `make bench-serve-kv`: mole serve with long prompts, every slot's KV cache
# full (-c) against bounded (--kv-budget: h2o, streaming, locret): the server's
# KV bytes and peak RSS, aggregate decode tokens/s, time to first token and
# inter-token latency, from bench/serve_load.py (STREAMS concurrent
# requests, each a prompt of PROMPT_CHARS characters, about 0.65 as many
# tokens with this vocabulary, then MAXTOK generated tokens).
#
# Model: bench/kv.sh's synth Mixtral layout (n_embd 1024, 8 heads of 128 /
# 2 KV heads, 4 layers, 8 experts top-2, vocab 32000, Q4_0, context 65536).
# Output: bench/out/serve-kv.txt (table), bench/out/serve-kv-runs.jsonl.
set -euo pipefail
cd "$(dirname "$0")/.."
MOLE=${MOLE:-build/mole}
THREADS=${THREADS:-2}
STREAMS=${STREAMS:-4}
PROMPT_CHARS=${PROMPT_CHARS:-12000}
MAXTOK=${MAXTOK:-64}
BUDGET=${BUDGET:-1024}
CTX=${CTX:-8704}
PORT=${PORT:-18241}
mkdir -p bench/out models/bench/kv
cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
l3=$(lscpu 2>/dev/null | sed -n 's/^L3 cache:[[:space:]]*//p' | head -1)
M=models/bench/kv/synth-kv-q4_0.gguf
if [ ! -f "$M" ]; then
  "$MOLE" synth --arch mixtral --embd 1024 --heads 8 --heads-kv 2 --layers 4 --experts 8 --used 2 --ff 1024 \
    --vocab 32000 --ctx 65536 --type q4_0 --seed 11 -o "$M.tmp" >&2
  mv "$M.tmp" "$M"
fi
HEADS=models/bench/kv/synth-kv-heads.gguf  # bench/kv.sh's retaining heads (meaningless on random weights, same cost)
if [ ! -f "$HEADS" ]; then
  "$MOLE" train-retain -m "$M" --data eval-model/heldout.txt -o "$HEADS" --tokens 16384 -t "$THREADS" >&2
fi
runs=bench/out/serve-kv-runs.jsonl
: > "$runs"

run_server() {  # label, then mole serve's KV flags
  local label=$1 log=bench/out/serve-kv-$1.log
  shift
  "$MOLE" serve -m "$M" -t "$THREADS" --port "$PORT" --parallel "$STREAMS" -c "$CTX" "$@" > "$log" 2>&1 &
  local pid=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" > /dev/null 2>&1 && break
    sleep 0.2
  done
  curl -sf "http://127.0.0.1:$PORT/health" > /dev/null || { cat "$log" >&2; echo "bench/serve_kv: no server" >&2; return 1; }
  python3 bench/serve_load.py "http://127.0.0.1:$PORT" "$STREAMS" --requests 1 --max-tokens "$MAXTOK" \
    --prompt-chars "$PROMPT_CHARS" > bench/out/serve-kv-one.json
  local hwm
  hwm=$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$pid/status")
  kill -INT "$pid"
  wait "$pid" || true
  python3 -c "import json,sys; d=json.load(open('bench/out/serve-kv-one.json')); d['cache']='$label'; \
d['peak_rss_mib']=round($hwm/1024, 1); print(json.dumps(d))" >> "$runs"
  tail -n 1 "$runs" >&2
}

run_server full
run_server "h2o-$BUDGET" --kv-budget "$BUDGET" --kv-policy h2o
run_server "streaming-$BUDGET" --kv-budget "$BUDGET" --kv-policy streaming
run_server "locret-$BUDGET" --kv-budget "$BUDGET" --kv-policy locret --retain "$HEADS"

python3 - "$runs" "$cpu" "$l3" "$STREAMS" "$PROMPT_CHARS" "$MAXTOK" "$THREADS" > bench/out/serve-kv.txt <<'PY'
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print("mole serve, long prompts: CPU %s, L3 %s, %s threads; %s streams, prompts of %s characters, %s tokens each"
      % (sys.argv[2], sys.argv[3], sys.argv[7], sys.argv[4], sys.argv[5], sys.argv[6]))
print()
print("| KV cache | KV MiB (all slots) | peak RSS MiB | tok/s (wall, prompts included) | TTFT p50 ms | ITL p50 ms | errors |")
print("|---|---|---|---|---|---|---|")
full = runs[0]
for r in runs:
    print("| %s | %.1f | %.1f | %.1f | %.0f | %.2f | %d |" % (r["cache"], r.get("kv_bytes", 0) / 2**20, r["peak_rss_mib"],
          r["tps"], r["ttft_p50_ms"], r["itl_p50_ms"], r["errors"]))
print()
for r in runs[1:]:
    print("%s vs full: KV bytes %.3fx, peak RSS %.2fx, tok/s %.2fx, TTFT %.2fx, ITL %.2fx" % (
        r["cache"], r.get("kv_bytes", 0) / max(full.get("kv_bytes", 1), 1), r["peak_rss_mib"] / full["peak_rss_mib"],
        r["tps"] / full["tps"], r["ttft_p50_ms"] / full["ttft_p50_ms"], r["itl_p50_ms"] / full["itl_p50_ms"]))
PY
cat bench/out/serve-kv.txt
