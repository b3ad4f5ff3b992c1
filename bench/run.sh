#!/usr/bin/env bash
# `make bench`, part 1: prompt (pp) and generation (tg) speed of mole against
# llama.cpp (when LLAMA_CPP_DIR points at a build of it) and against the
# memory floor (weight bytes read per token / measured read bandwidth).
#
# Models: Mixtral-shaped (n_embd 1024, 8 experts top-2, expert FFN 3584,
# vocab 32000) with enough layers that the smallest (Q4_0) is at least 4x
# the last-level cache, so decode runs from DRAM: synth's Q4_0 and Q8_0, and
# (with llama.cpp) Q4_0, Q8_0, Q4_K_M and Q5_K_M files made by llama-quantize from
# synth's F16. The machine's bandwidth drifts (other tenants of the host),
# so every figure is measured in rounds that interleave membw, mole and
# llama.cpp; the table gives medians over the rounds, the ratios as the
# median of each round's mole / llama.cpp pair and the % of the floor as the
# median of each run against the bandwidth read around it (with the range
# over the rounds); every run is in bench/out/decode-runs.tsv.
#
# MOLE_ISA=avx2 (make bench-avx2) measures mole's AVX2 kernels instead, against
# the llama.cpp build LLAMA_CPP_DIR points at (for that table, one built for
# AVX2 only: -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_AVX512=OFF); its outputs
# carry the suffix -avx2.
set -euo pipefail
cd "$(dirname "$0")/.."
MOLE=${MOLE:-build/mole}
THREADS=${THREADS:-2}
SFX=${MOLE_ISA:+-$MOLE_ISA}
PP=${PP:-128}
TG=${TG:-64}
ROUNDS=${ROUNDS:-3}
mkdir -p bench/out

cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
l3_kib=0
for c in /sys/devices/system/cpu/cpu0/cache/index*; do
  [ "$(cat "$c/level" 2>/dev/null)" = 3 ] || continue
  s=$(cat "$c/size")
  case "$s" in *K) l3_kib=${s%K} ;; *M) l3_kib=$((${s%M} * 1024)) ;; *) l3_kib=$((s / 1024)) ;; esac
done
[ "$l3_kib" -gt 0 ] || l3_kib=32768  # unknown: assume 32 MiB
# Q4_0 bytes of this shape: ~49.5 MiB per layer + 36 MiB of embeddings and output
layers=$(( (4 * l3_kib / 1024 - 36 + 48) / 49 ))
[ "$layers" -ge 8 ] || layers=8
echo "CPU: ${cpu:-unknown}; L3: $((l3_kib / 1024)) MiB; models: $layers layers (Q4_0 >= 4x L3); $THREADS threads"

MODELS=models/bench/synth-r2-l$layers
mkdir -p "$MODELS"
synth() {  # type, output
  [ -f "$2" ] && return 0
  "$MOLE" synth --arch mixtral --embd 1024 --layers "$layers" --experts 8 --used 2 --ff 3584 --vocab 32000 \
    --type "$1" --seed 7 -o "$2.tmp" >&2
  mv "$2.tmp" "$2"
}
LLAMA_BIN=""
if [ -n "${LLAMA_CPP_DIR:-}" ]; then
  for c in "$LLAMA_CPP_DIR/build/bin" "$LLAMA_CPP_DIR/bin" "$LLAMA_CPP_DIR"; do
    [ -x "$c/llama-bench" ] && LLAMA_BIN=$c && break
  done
  [ -z "$LLAMA_BIN" ] && echo "bench: LLAMA_CPP_DIR=$LLAMA_CPP_DIR has no llama-bench; comparing nothing" >&2
fi
names=(synth-q4_0 synth-q8_0)
synth q4_0 "$MODELS/synth-q4_0.gguf"
synth q8_0 "$MODELS/synth-q8_0.gguf"
if [ -n "$LLAMA_BIN" ] && [ -x "$LLAMA_BIN/llama-quantize" ]; then
  synth f16 "$MODELS/synth-f16.gguf"
  for q in Q4_0 Q8_0 Q4_K_M Q5_K_M; do
    f="$MODELS/llama-quantize-$q.gguf"
    if [ ! -f "$f" ]; then
      "$LLAMA_BIN/llama-quantize" "$MODELS/synth-f16.gguf" "$f.tmp" "$q" "$THREADS" > bench/out/quantize-$q.log 2>&1
      mv "$f.tmp" "$f"
    fi
    names+=("llama-quantize-$q")
  done
fi

runs=bench/out/decode-runs$SFX.tsv
printf "round\tmodel\tmembw_gbs\tactive_bytes\tmole_pp\tmole_tg\tllama_pp\tllama_tg\tmembw_after_gbs\n" > "$runs"
for r in $(seq 1 "$ROUNDS"); do
  for n in "${names[@]}"; do
    M=$MODELS/$n.gguf
    # The bandwidth before mole, between mole and llama.cpp, and after: on a
    # VM whose cores may or may not share a memory link (Zen 4: one CCD's
    # link, ~35 GB/s, or two, ~60) it can change from one second to the
    # next; a round whose three readings differ by more than 15% is run
    # again (up to 3 tries, the last one kept either way), and mole's floor
    # is the mean of the readings around its run.
    for try in 1 2 3; do
      bw0=$(build/bench/membw "$THREADS" 512 1)
      J=$("$MOLE" bench -m "$M" -p "$PP" -n "$TG" -t "$THREADS" -r 1 --json)
      bw1=$(build/bench/membw "$THREADS" 512 1)
      LJ=""
      if [ -n "$LLAMA_BIN" ]; then
        "$LLAMA_BIN/llama-bench" -m "$M" -p "$PP" -n "$TG" -t "$THREADS" -r 1 -o json > "bench/out/llama-$n$SFX.json" 2>/dev/null
        LJ=bench/out/llama-$n$SFX.json
      fi
      bw2=$(build/bench/membw "$THREADS" 512 1)
      python3 -c 'import sys; b = [float(v) for v in sys.argv[1:]]; sys.exit(0 if max(b) <= 1.15 * min(b) else 1)' \
        "$bw0" "$bw1" "$bw2" && break
      echo "bench: round $r, $n: bandwidth moved during the runs ($bw0 / $bw1 / $bw2 GB/s), try $try" >&2
    done
    echo "$J" > "bench/out/mole-$n$SFX.json"
    bw=$(python3 -c 'import sys; print("%.2f" % ((float(sys.argv[1]) + float(sys.argv[2])) / 2))' "$bw0" "$bw1")
    python3 - "$r" "$n" "$bw" "$J" "$LJ" "$bw2" >> "$runs" <<'PY'
import json, sys
r, n, bw, mj, lj, bw2 = sys.argv[1:7]
m = json.loads(mj)
lpp = ltg = 0.0
if lj:
    for row in json.load(open(lj)):
        if row.get("n_prompt", 0) > 0 and row.get("n_gen", 0) == 0: lpp = row["avg_ts"]
        if row.get("n_gen", 0) > 0 and row.get("n_prompt", 0) == 0: ltg = row["avg_ts"]
print(f"{r}\t{n}\t{bw}\t{m['active_bytes']}\t{m['pp_tps']:.2f}\t{m['tg_tps']:.2f}\t{lpp:.2f}\t{ltg:.2f}\t{bw2}")
PY
  done
done

isa=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("isa","?"))' "bench/out/mole-${names[0]}$SFX.json")
python3 - "$runs" "$cpu" "$((l3_kib / 1024))" "$THREADS" "$isa" "${LLAMA_BIN:-none}" <<'PY' | tee bench/out/decode$SFX.txt
import csv, statistics as st, sys
runs, cpu, l3, th, isa, lb = sys.argv[1:7]
rows = list(csv.DictReader(open(runs), delimiter="\t"))
print(f"CPU {cpu}, L3 {l3} MiB, {th} threads; medians of {len(set(r['round'] for r in rows))} rounds")
print(f"mole kernels: {isa}; llama.cpp: {lb}")
print("%-22s %8s %8s %7s | %8s %8s %7s | %7s %8s %6s" % ("model", "mole pp", "llama pp", "ratio", "mole tg", "llama tg", "ratio",
                                                       "GB/s", "floor tg", "%floor"))
for n in dict.fromkeys(r["model"] for r in rows):
    R = [r for r in rows if r["model"] == n]
    med = lambda k: st.median(float(r[k]) for r in R)
    bw, ab = med("membw_gbs"), float(R[0]["active_bytes"])
    floor = bw * 1e9 / ab
    # the ratio: the median over rounds of mole / llama.cpp measured back to back in that round
    # (the bandwidth drifts between rounds; a pair shares the drift)
    def ratio(a, b):
        if any(float(r[b]) <= 0 for r in R): return "-"
        return "%.2fx" % st.median(float(r[a]) / float(r[b]) for r in R)
    # % of floor: each run against the bandwidth read around it (membw_gbs)
    pfs = [float(r["mole_tg"]) * ab / (float(r["membw_gbs"]) * 1e9) for r in R]
    pf = st.median(pfs)
    print("%-22s %8.1f %8.1f %7s | %8.1f %8.1f %7s | %7.1f %8.1f %5.0f%%" % (
        n, med("mole_pp"), med("llama_pp"), ratio("mole_pp", "llama_pp"), med("mole_tg"), med("llama_tg"),
        ratio("mole_tg", "llama_tg"), bw, floor, 100 * pf) + "  (%.0f-%.0f%%)" % (100 * min(pfs), 100 * max(pfs)))
PY
