#!/usr/bin/env bash
# Perplexity of one model on one text, by mole and by llama.cpp's
# llama-perplexity with the same context, batch, threads and KV cache type
# (f16 on both sides, each one's default), side by side with their ratio.
#   bench/perplexity.sh MODEL.gguf TEXT.txt [-c N] [-b N] [--chunks N] [more mole flags...]
# Env: LLAMA_CPP_DIR (default /work/llama.cpp; its build/bin/llama-perplexity),
#      MOLE (default build/mole), THREADS (default 2), LLAMA_ARGS (extra
#      llama-perplexity flags, e.g. "-fa off").
# Prints: model, text, c, mole PPL, llama.cpp PPL, mole/llama.cpp, relative difference.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
  echo "usage: $0 MODEL.gguf TEXT.txt [-c N] [-b N] [--chunks N] [mole flags...]" >&2
  exit 2
fi
MODEL=$1 TEXT=$2
shift 2
MOLE=${MOLE:-build/mole}
THREADS=${THREADS:-2}
LLAMA_CPP_DIR=${LLAMA_CPP_DIR:-/work/llama.cpp}
LP=""
for c in "$LLAMA_CPP_DIR/build/bin/llama-perplexity" "$LLAMA_CPP_DIR/bin/llama-perplexity"; do
  [ -x "$c" ] && LP=$c && break
done
[ -n "$LP" ] || { echo "$0: no llama-perplexity under $LLAMA_CPP_DIR (build/bin or bin)" >&2; exit 1; }
[ -x "$MOLE" ] || { echo "$0: no mole binary at $MOLE (set MOLE=)" >&2; exit 1; }
[ -r "$MODEL" ] || { echo "$0: cannot read model '$MODEL'" >&2; exit 1; }
[ -r "$TEXT" ] || { echo "$0: cannot read text '$TEXT'" >&2; exit 1; }

# the flags both understand are passed to both; anything else to mole only
CTX=512 BATCH=512 SHARED=() MOLE_ONLY=()
while [ $# -gt 0 ]; do
  case $1 in
    -c | --ctx) CTX=$2; shift 2 ;;
    -b | --batch) BATCH=$2; shift 2 ;;
    --chunks) SHARED+=(--chunks "$2"); shift 2 ;;
    *) MOLE_ONLY+=("$1"); shift ;;
  esac
done

final() { sed -n 's/.*Final estimate: PPL = \([0-9.eE+-]*\).*/\1/p' | tail -1; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
"$MOLE" perplexity -m "$MODEL" -f "$TEXT" -c "$CTX" -b "$BATCH" -t "$THREADS" "${SHARED[@]}" "${MOLE_ONLY[@]}" \
  >"$T/mole.out" 2>"$T/mole.err" || { cat "$T/mole.err" >&2; exit 1; }
# llama-perplexity writes the running estimates to stdout and the final line to stderr
LD_LIBRARY_PATH="$(dirname "$LP")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
  "$LP" -m "$MODEL" -f "$TEXT" -c "$CTX" -b "$BATCH" -t "$THREADS" "${SHARED[@]}" ${LLAMA_ARGS:-} \
  >"$T/llama.out" 2>"$T/llama.err" || { tail -20 "$T/llama.err" >&2; exit 1; }
pm=$(final <"$T/mole.out")
pl=$(cat "$T/llama.out" "$T/llama.err" | final)
[ -n "$pm" ] || { echo "$0: no final estimate from mole" >&2; cat "$T/mole.err" >&2; exit 1; }
[ -n "$pl" ] || { echo "$0: no final estimate from llama-perplexity" >&2; tail -20 "$T/llama.err" >&2; exit 1; }
cm=$(grep -o '\[[0-9]*\]' "$T/mole.out" | wc -l)
cl=$(grep -o '\[[0-9]*\]' "$T/llama.out" | wc -l)
printf 'model\ttext\tc\tchunks(mole/llama)\tmole_ppl\tllama_ppl\tratio\trel_diff\n'
awk -v m="$(basename "$MODEL")" -v t="$(basename "$TEXT")" -v c="$CTX" -v cm="$cm" -v cl="$cl" -v a="$pm" -v b="$pl" \
  'BEGIN { d = (a - b) / b; printf "%s\t%s\t%s\t%s/%s\t%s\t%s\t%.6f\t%+.3e\n", m, t, c, cm, cl, a, b, a / b, d }'
