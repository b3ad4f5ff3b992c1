#!/usr/bin/env bash
# `make bench`, part 3: mole serve under a bounded load on loopback at 1, 2,
# 4, 8 and 16 concurrent streams (bench/serve_load.py), resident and with
# the experts offloaded (budget: half their size), and the same load
# against llama-server --parallel 8 (when LLAMA_CPP_DIR has it), same model,
# same threads. One table (bench/out/serve.txt, every run in
# bench/out/serve-runs.jsonl) and bench/out/serve-{tps,ttft}.png.
set -euo pipefail
cd "$(dirname "$0")/.."
MOLE=${MOLE:-build/mole}
THREADS=${THREADS:-2}
STREAMS=${STREAMS:-"1 2 4 8 16"}
REQUESTS=${REQUESTS:-3}
MAXTOK=${MAXTOK:-64}
M=${SERVE_MODEL:-models/bench/synth-r2-l8/synth-q4_0.gguf}
mkdir -p bench/out "$(dirname "$M")"
if [ ! -f "$M" ]; then
  "$MOLE" synth --arch mixtral --embd 1024 --layers 8 --experts 8 --used 2 --ff 3584 --vocab 32000 --type q4_0 \
    --seed 7 -o "$M.tmp" >&2
  mv "$M.tmp" "$M"
fi
runs=bench/out/serve-runs.jsonl
: > "$runs"
PORT=${PORT:-18231}

wait_up() {  # url log
  for _ in $(seq 600); do
    curl -sf "$1/health" > /dev/null 2>&1 && return 0
    sleep 0.2
  done
  cat "$2" >&2
  echo "bench/serve: the server did not come up" >&2
  return 1
}

run_server() {  # label, then the command line
  local label=$1
  shift
  "$@" > "bench/out/serve-$label.log" 2>&1 &
  local pid=$!
  wait_up "http://127.0.0.1:$PORT" "bench/out/serve-$label.log"
  for n in $STREAMS; do
    python3 bench/serve_load.py "http://127.0.0.1:$PORT" "$n" --requests "$REQUESTS" --max-tokens "$MAXTOK" |
      python3 -c "import json,sys; d=json.load(sys.stdin); d['server']='$label'; print(json.dumps(d))" >> "$runs"
    tail -n 1 "$runs" >&2
  done
  kill -INT "$pid"
  wait "$pid" || true
}

run_server mole-resident "$MOLE" serve -m "$M" -t "$THREADS" --port "$PORT" --parallel 16 -c 512
run_server mole-offload "$MOLE" serve -m "$M" -t "$THREADS" --port "$PORT" --parallel 16 -c 512 --expert-budget 50%
if [ -n "${LLAMA_CPP_DIR:-}" ]; then
  LS=""
  for c in "$LLAMA_CPP_DIR/build/bin/llama-server" "$LLAMA_CPP_DIR/bin/llama-server"; do [ -x "$c" ] && LS=$c && break; done
  if [ -n "$LS" ]; then
    # 8 slots of 512 tokens each, as mole's 16 x 512 would not fit its unified cache the same way
    run_server llama-server "$LS" -m "$M" -t "$THREADS" --port "$PORT" --parallel 8 -c 4096 --metrics -ngl 0
  fi
fi

python3 - "$runs" <<'PY' | tee bench/out/serve.txt
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("%-14s %7s %9s %9s %9s %9s %9s %12s %6s" % ("server", "streams", "tok/s", "TTFT p50", "TTFT p99",
                                                  "ITL p50", "ITL p99", "bytes/token", "errors"))
for r in rows:
    print("%-14s %7d %9.1f %7.0fms %7.0fms %7.1fms %7.1fms %12s %6d" % (
        r["server"], r["streams"], r["tps"], r["ttft_p50_ms"], r["ttft_p99_ms"], r["itl_p50_ms"], r["itl_p99_ms"],
        "%.1f MiB" % (r["bytes_per_token"] / 1048576) if "bytes_per_token" in r else "-", r["errors"]))
for s in ("mole-resident",):
    one = [r["tps"] for r in rows if r["server"] == s and r["streams"] == 1]
    eight = [r["tps"] for r in rows if r["server"] == s and r["streams"] == 8]
    if one and eight:
        print("%s: aggregate decode at 8 streams = %.2fx one stream" % (s, eight[0] / one[0]))
PY

if command -v gnuplot > /dev/null; then
  python3 - "$runs" > bench/out/serve-plot.dat <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for s in dict.fromkeys(r["server"] for r in rows):
    print('"%s"' % s)
    for r in rows:
        if r["server"] == s:
            print(r["streams"], r["tps"], r["ttft_p50_ms"], r["itl_p50_ms"])
    print("\n")
PY
  n=$(grep -c '^"' bench/out/serve-plot.dat)
  for what in tps ttft; do
    col=2; ylab="generated tokens/s (all streams)"
    [ "$what" = ttft ] && col=3 && ylab="time to first token p50 (ms)"
    gnuplot <<GP
set terminal pngcairo size 800,500
set output "bench/out/serve-$what.png"
set logscale x 2
set xlabel "concurrent streams"
set ylabel "$ylab"
set key top left
set grid
plot for [i=0:$((n - 1))] "bench/out/serve-plot.dat" index i using 1:$col with linespoints title columnheader(1)
GP
  done
fi
