#!/usr/bin/env bash
# `make bench-kv`: a bounded KV cache (Locret's setting) against the full one
# on long prompts.
#
# Model: synth Mixtral layout, n_embd 1024, 8 heads of 128 / 2 KV heads, 4
# layers, 8 experts top-2 (FFN 1024), vocab 32000, Q4_0, context 65536: the
# attention of a real model's layer at a size where 64K-token prompts run in
# minutes on 2 cores. Prompts of 4K..64K random tokens, prefilled in chunks of
# $CHUNK (-b); the bounded cache keeps $BUDGET entries per layer and KV head
# (recent budget/4, sinks 4) with streaming, h2o and locret (retaining heads
# from mole train-retain on any text: meaningless on random weights, but they
# cost what trained heads cost). The full cache runs up to $FULL_MAX tokens
# (its prefill is quadratic). Per run: prefill tokens/s, the KV cache's
# resident bytes (rows, and the bounded cache's positions and scores) and the
# process's peak RSS, from mole bench --json.
# Output: bench/out/kv.tsv, bench/out/kv.png (gnuplot).
set -euo pipefail
cd "$(dirname "$0")/.."
MOLE=${MOLE:-build/mole}
THREADS=${THREADS:-2}
BUDGET=${BUDGET:-2048}
CHUNK=${CHUNK:-512}
LENGTHS=${LENGTHS:-"4096 8192 16384 32768 65536"}
FULL_MAX=${FULL_MAX:-32768}
POLICIES=${POLICIES:-"streaming h2o locret"}
mkdir -p bench/out models/bench/kv

cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
l3=$(lscpu 2>/dev/null | sed -n 's/^L3 cache:[[:space:]]*//p' | head -1)
echo "CPU: ${cpu:-unknown}; L3: ${l3:-unknown}; $THREADS threads; budget $BUDGET, chunk $CHUNK"

M=models/bench/kv/synth-kv-q4_0.gguf
if [ ! -f "$M" ]; then
  "$MOLE" synth --arch mixtral --embd 1024 --heads 8 --heads-kv 2 --layers 4 --experts 8 --used 2 --ff 1024 \
    --vocab 32000 --ctx 65536 --type q4_0 --seed 11 -o "$M.tmp" >&2
  mv "$M.tmp" "$M"
fi
HEADS=models/bench/kv/synth-kv-heads.gguf
if [[ " $POLICIES " == *" locret "* ]] && [ ! -f "$HEADS" ]; then
  # any text: the made-up vocabulary tokenizes it byte by byte
  "$MOLE" train-retain -m "$M" --data eval-model/heldout.txt -o "$HEADS" --tokens 16384 -t "$THREADS" >&2
fi

run() {  # label, prompt length, extra flags...
  local label=$1 n=$2
  shift 2
  local j
  j=$("$MOLE" bench -m "$M" -p "$n" -n 0 -r 1 -b "$CHUNK" -t "$THREADS" --json "$@")
  python3 -c '
import json, sys
j = json.loads(sys.argv[3])
print("\t".join([sys.argv[1], sys.argv[2], "%.1f" % j["pp_tps"], "%.2f" % (j["kv"]["bytes"] / 1048576),
                 "%.1f" % (j["peak_rss_bytes"] / 1048576), str(j["kv"]["used"]), str(j["kv"]["evicted"])]))
' "$label" "$n" "$j"
}

out=bench/out/kv.tsv
printf "cache\tprompt\tprefill_tps\tkv_mib\tpeak_rss_mib\tslots_used\tevicted\n" > "$out"
for n in $LENGTHS; do
  if [ "$n" -le "$FULL_MAX" ]; then run full "$n" -c "$n" | tee -a "$out"; fi
  for p in $POLICIES; do
    extra=(--kv-budget "$BUDGET" --kv-policy "$p")
    [ "$p" = locret ] && extra+=(--retain "$HEADS")
    run "$p" "$n" "${extra[@]}" | tee -a "$out"
  done
done
column -t "$out"

if command -v gnuplot > /dev/null; then
  gnuplot << GP
set terminal pngcairo size 1100,450 noenhanced
set output "bench/out/kv.png"
set multiplot layout 1,2 title "bounded KV cache (budget $BUDGET, chunk $CHUNK) vs full: synth Mixtral layout 1024/8 heads/2 KV/4 layers, ${cpu:-CPU}, $THREADS threads"
set logscale x 2
set xlabel "prompt tokens"
set key top left
set ylabel "KV cache resident MiB"
plot for [p in "full streaming h2o locret"] "< awk -F'\t' '\$1==\"".p."\"' $out" using 2:4 with linespoints title p
set ylabel "prefill tokens/s"
set yrange [0:*]
plot for [p in "full streaming h2o locret"] "< awk -F'\t' '\$1==\"".p."\"' $out" using 2:3 with linespoints title p
unset multiplot
GP
  echo "plot: bench/out/kv.png"
fi
