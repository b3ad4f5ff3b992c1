#!/usr/bin/env bash
# QMoE compression (mole compress) measured in one run:
#  1. quality on the trained evaluation model: held-out perplexity
#     (eval-model/heldout.txt, -c 512) of the experts in F16 (the source), Q4_0,
#     2-bit GPTQ, 2-bit RTN, ternary GPTQ and ternary RTN (only the experts differ),
#     with KL divergence and top-1 agreement against F16 at every scored position,
#     and each compression's report (bits per weight, zero fraction, entropy bound);
#  2. the fused decode kernels against mole's Q4_0 and Q8_0 matvec (quant_bench tq, at 90% and
#     80% zeros: the eval model's GPTQ ternary rows have 80%; one copy of each matrix, then at
#     80% with the weights from DRAM (DRAM_MIB of copies), with the default 30-weight code (the
#     packed table's kernel), the 32-weight one (the masks' 256-bit kernel) and the 64-weight one
#     (512-bit)), and whole decode of a
#     Mixtral-8x7B-shaped layer with its experts in Q4_0 against the same compressed (part 4's file);
#  3. the compressed copy as HOBBIT's low tier under the memory limits of
#     bench/offload.sh (MODEL= the committed Q8_0 eval model), against a Q4_0 low
#     tier and llama.cpp (LLAMA_CPP_DIR), both under the same limits (BASE_MIB=20: 30 and
#     25 MiB, i.e. budgets of 1/2 and 1/4 of the experts; LIMITS_MIB overrides) — lru and the
#     configurations that use a low tier;
#  4. a Mixtral-8x7B-shaped layer (synthetic, 8 experts of 4096 x 14336) through
#     mole compress: time and peak RSS.
# SRC16 (default models/eval/mole-eval-moe-f16.gguf, from make eval-model) is the
# F16 source; CALIB the calibration text (default models/eval/train.txt, the
# training corpus: never the held-out text). SKIP="1 2 3 4" skips parts.
# Output: tables on stdout, bench/out/compress*.tsv.
set -euo pipefail
cd "$(dirname "$0")/.."
MOLE=${MOLE:-build/mole}
QB=${QB:-build/bench/quant_bench}
THREADS=${THREADS:-2}
SRC16=${SRC16:-models/eval/mole-eval-moe-f16.gguf}
Q8=${Q8:-eval-model/mole-eval-moe-q8_0.gguf}
CALIB=${CALIB:-models/eval/train.txt}
CALIB_TOKENS=${CALIB_TOKENS:-32768}
HELD=${HELD:-eval-model/heldout.txt}
SKIP=${SKIP:-}
OUT=bench/out
M=models/bench/compress
mkdir -p "$OUT" "$M"
skip() { case " $SKIP " in *" $1 "*) return 0 ;; esac; return 1; }
cpu="$(lscpu | sed -n 's/^Model name: *//p'), L3 $(lscpu | sed -n 's/^L3 cache: *//p')"
echo "== CPU: $cpu"
[ -f "$CALIB" ] || { echo "compress: CALIB=$CALIB: no such file (make eval-model writes the corpus)" >&2; exit 1; }

if ! skip 1; then
  [ -f "$SRC16" ] || { echo "compress: SRC16=$SRC16: no such file (make eval-model)" >&2; exit 1; }
  TSV=$OUT/compress-quality.tsv
  printf "variant\tbits_per_weight\tzero_frac\tentropy\tppl\tkld\ttop1\n" >"$TSV"
  [ "$M/experts-q4_0.gguf" -nt "$SRC16" ] || "$MOLE" pack "$SRC16" -o "$M/experts-q4_0.gguf" --high q4_0 -t "$THREADS" >&2
  variants=("f16|$SRC16|" "q4_0|$M/experts-q4_0.gguf|")
  for v in "gptq-2bit|--bits 2" "rtn-2bit|--bits 2 --rtn" "gptq-ternary|" "rtn-ternary|--rtn"; do
    name=${v%%|*} flags=${v#*|}
    f=$M/eval-$name.gguf
    if [ ! "$f" -nt "$SRC16" ]; then
      echo "== mole compress $name" >&2
      # shellcheck disable=SC2086
      "$MOLE" compress "$SRC16" -o "$f" --calib "$CALIB" --calib-tokens "$CALIB_TOKENS" -t "$THREADS" $flags >"$M/eval-$name.report"
    fi
    variants+=("$name|$f|$M/eval-$name.report")
  done
  echo "== held-out perplexity ($HELD, -c 512); KL divergence and top-1 agreement against F16 at every scored position"
  for v in "${variants[@]}"; do
    IFS='|' read -r name f rep <<<"$v"
    out=$("$MOLE" perplexity -m "$f" -f "$HELD" -c 512 -t "$THREADS" --ref "$SRC16" 2>/dev/null)
    ppl=$(sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p' <<<"$out")
    read -r kld top1 npos < <(sed -n 's/^KL divergence vs .*: \([0-9.e-]*\) +\/- [0-9.e-]*, top-1 agreement \([0-9.]*\)% over \([0-9]*\) positions/\1 \2 \3/p' <<<"$out")
    bits=- zf=- ent=-
    if [ -n "$rep" ]; then
      bits=$(sed -n 's/^bits per weight *\([0-9.]*\).*/\1/p' "$rep")
      zf=$(sed -n 's/^zero fraction *\([0-9.]*\).*/\1/p' "$rep")
      ent=$(sed -n 's/^entropy bound *\([0-9.]*\).*/\1/p' "$rep")
    fi
    [ "$name" = f16 ] && bits=16
    [ "$name" = q4_0 ] && bits=4.5
    printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$name" "$bits" "$zf" "${ent:--}" "$ppl" "$kld" "$top1" | tee -a "$TSV"
  done
  echo "(positions compared: ${npos:-?})"
  for v in "${variants[@]}"; do
    IFS='|' read -r name f rep <<<"$v"
    [ -n "$rep" ] && { echo "-- $name"; cat "$rep"; }
  done
fi

if ! skip 2; then
  echo "== fused decode kernels, weights/s against mole's Q4_0 and Q8_0 matvec ($cpu)"
  {
    for z in ${ZEROS:-0.9 0.8}; do "$QB" tq -z "$z"; done
    # as in decode of a real model: every matrix from DRAM (copies well past the L3)
    "$QB" tq -z 0.8 -d "${DRAM_MIB:-512}"
    echo "-- the same with the 32-weight code (runs of 16 pairs: the masks' 256-bit kernels)"
    "$QB" tq -z 0.8 -d "${DRAM_MIB:-512}" -q -p 16
    echo "-- the same with the 64-weight code (runs of 32 pairs: the 512-bit kernels)"
    "$QB" tq -z 0.8 -d "${DRAM_MIB:-512}" -q -p 32
  } 2>&1 | tee "$OUT/compress-kernels.txt"
  L8=$M/mixtral-8x7b-layer-q4_0.gguf L8T=$M/mixtral-8x7b-layer-tq.gguf
  if [ -f "$L8" ] && [ -f "$L8T" ]; then
    echo "== decode of the Mixtral-8x7B-shaped layer (all resident; tokens/s, alternating runs)"
    for pass in 1 2; do
      for f in "$L8" "$L8T"; do
        printf "%s\t%s\n" "$(basename "$f" .gguf)" "$("$MOLE" bench -m "$f" -p 0 -n 48 -r 2 -t "$THREADS" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["tg_tps"])')"
      done
    done | tee -a "$OUT/compress-kernels.txt"
  else
    echo "(part 4 makes the Mixtral-8x7B-shaped layer files for the decode comparison)"
  fi
fi

if ! skip 3; then
  LOWF=$M/eval-q8-gptq-ternary.gguf
  [ "$LOWF" -nt "$Q8" ] || "$MOLE" compress "$Q8" -o "$LOWF" --calib "$CALIB" --calib-tokens "$CALIB_TOKENS" -t "$THREADS" >"$M/eval-q8-gptq-ternary.report"
  for low in q4_0 "$LOWF"; do
    echo "== offload with the low tier $low"
    BASE_MIB=${BASE_MIB:-20} LIMITS_MIB=${LIMITS_MIB:-"30 25"} MODEL=$Q8 LOW=$low ONLY="${ONLY:-hobbit+mixed hobbit+prefetch+mixed lru}" PASSES=${PASSES:-2} NGEN=${NGEN:-64} \
      bash bench/offload.sh
  done
fi

if ! skip 4; then
  L8=$M/mixtral-8x7b-layer-q4_0.gguf
  [ -f "$L8" ] || "$MOLE" synth --arch mixtral --embd 4096 --layers 1 --heads 32 --heads-kv 8 --experts 8 --used 2 \
    --ff 14336 --vocab 32000 --type q4_0 --seed 5 -o "$L8" >&2
  echo "== one Mixtral-8x7B-shaped layer ($(($(stat -c %s "$L8") >> 20)) MiB in Q4_0) through mole compress"
  /usr/bin/time -v "$MOLE" compress "$L8" -o "$M/mixtral-8x7b-layer-tq.gguf" --calib "$CALIB" \
    --calib-tokens "${L8_TOKENS:-2048}" -t "$THREADS" 2>"$M/l8.time" | tee "$OUT/compress-8x7b-layer.txt"
  grep -E "Maximum resident|Elapsed" "$M/l8.time" | tee -a "$OUT/compress-8x7b-layer.txt"
fi
