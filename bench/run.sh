#!/usr/bin/env bash
# `make bench`: mole vs llama.cpp (when LLAMA_CPP_DIR points at a build of it)
# on a Mixtral-shaped ~0.8B model (n_embd 1024, 8 layers, 8 experts top-2,
# expert FFN 3584, 32000 vocab) in Q4_0 and Q8_0, 2 threads. Prints tokens/s,
# the ratio mole/llama.cpp, and the distance to the memory-bandwidth floor.
set -euo pipefail
cd "$(dirname "$0")/.."
MOLE=${MOLE:-build/mole}
THREADS=${THREADS:-2}
TYPES=${TYPES:-"q4_0 q8_0"}
PP=${PP:-128}
TG=${TG:-64}
# the models depend on synth's revision (r2: larger token embeddings, see synth.c)
MODELS=models/bench/synth-r2
mkdir -p "$MODELS" bench/out
LLAMA_BENCH=""
if [ -n "${LLAMA_CPP_DIR:-}" ]; then
  for c in "$LLAMA_CPP_DIR/build/bin/llama-bench" "$LLAMA_CPP_DIR/bin/llama-bench" "$LLAMA_CPP_DIR/llama-bench"; do
    [ -x "$c" ] && LLAMA_BENCH=$c && break
  done
  [ -z "$LLAMA_BENCH" ] && echo "bench: LLAMA_CPP_DIR=$LLAMA_CPP_DIR has no llama-bench; comparing nothing" >&2
fi
BW=$(build/bench/membw "$THREADS" 1024)
echo "memory read bandwidth ($THREADS threads): $BW GB/s"
printf "%-6s %10s %10s %8s | %10s %10s %8s | %8s %8s\n" type "mole pp" "llama pp" ratio "mole tg" "llama tg" ratio "floor" "%floor"
for t in $TYPES; do
  M=$MODELS/mixtral-0.8b-$t.gguf
  if [ ! -f "$M" ]; then
    "$MOLE" synth --arch mixtral --embd 1024 --layers 8 --experts 8 --used 2 --ff 3584 --vocab 32000 \
      --type "$t" --seed 7 -o "$M.tmp" >&2
    mv "$M.tmp" "$M"
  fi
  J=$("$MOLE" bench -m "$M" -p "$PP" -n "$TG" -t "$THREADS" -r 3 --json)
  echo "$J" > "bench/out/mole-$t.json"
  LPP=0; LTG=0
  if [ -n "$LLAMA_BENCH" ]; then
    "$LLAMA_BENCH" -m "$M" -p "$PP" -n "$TG" -t "$THREADS" -r 3 -o json > "bench/out/llama-$t.json" 2>/dev/null
    read -r LPP LTG < <(python3 -c '
import json,sys
d=json.load(open(sys.argv[1])); pp=tg=0
for r in d:
    if r.get("n_prompt",0)>0 and r.get("n_gen",0)==0: pp=r["avg_ts"]
    if r.get("n_gen",0)>0 and r.get("n_prompt",0)==0: tg=r["avg_ts"]
print(pp,tg)' "bench/out/llama-$t.json")
  fi
  python3 - "$t" "$BW" "$LPP" "$LTG" <<PY
import json,sys
t,bw,lpp,ltg=sys.argv[1],float(sys.argv[2]),float(sys.argv[3]),float(sys.argv[4])
m=json.loads('''$J''')
floor=bw*1e9/m["active_bytes"]
r=lambda a,b: "%.2fx"%(a/b) if b>0 else "-"
print("%-6s %10.1f %10.1f %8s | %10.1f %10.1f %8s | %8.1f %7.0f%%"%(t,m["pp_tps"],lpp,r(m["pp_tps"],lpp),m["tg_tps"],ltg,r(m["tg_tps"],ltg),floor,100*m["tg_tps"]/floor))
PY
done
