#!/usr/bin/env bash
# The trained evaluation model against a random-weight model of the same layout, in one run:
#  - perplexity of eval-model/heldout.txt (-c 512, as llama-perplexity counts it), mole and
#    llama-perplexity (when LLAMA_CPP_DIR has a build) for F32/F16/Q8_0 files when present
#    (make eval-model writes them under models/eval/);
#  - routing realism in mole's own decode: the predictor's accuracy (the experts of layer
#    l+1 predicted from layer l's gate input, share of the predicted pair that is used);
#  - the expert cache on the routing trace of that run (mole cachesim: every policy and
#    Belady's offline optimum) at budgets of 25% and 50% of the experts.
# Output: a table on stdout and bench/out/eval-model.tsv.
set -euo pipefail
cd "$(dirname "$0")/.."
MOLE=${MOLE:-build/mole}
THREADS=${THREADS:-2}
NGEN=${NGEN:-480}
TRAINED=${MODEL:-eval-model/mole-eval-moe-q8_0.gguf}
TEXT=${TEXT:-eval-model/heldout.txt}
OUT=bench/out
mkdir -p "$OUT" models/bench
RANDOM_M=models/bench/eval-random-q8_0.gguf
[ -f "$RANDOM_M" ] || "$MOLE" synth --arch mixtral --embd 256 --layers 6 --heads 8 --heads-kv 2 --experts 16 --used 2 \
  --ff 256 --ctx 1024 --vocab-from "$TRAINED" --type q8_0 --seed 3 -o "$RANDOM_M" >&2
PPL_BIN=""
[ -n "${LLAMA_CPP_DIR:-}" ] && [ -x "$LLAMA_CPP_DIR/build/bin/llama-perplexity" ] && PPL_BIN=$LLAMA_CPP_DIR/build/bin/llama-perplexity
final() { sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p'; }

TSV=$OUT/eval-model.tsv
printf "model\tmeasure\tvalue\n" >"$TSV"
row() { printf "%s\t%s\t%s\n" "$@" | tee -a "$TSV"; }

echo "== perplexity of $TEXT, -c 512 (CPU: $(lscpu | sed -n 's/^Model name: *//p'), L3 $(lscpu | sed -n 's/^L3 cache: *//p'))"
for f in models/eval/mole-eval-moe-f32.gguf models/eval/mole-eval-moe-f16.gguf "$TRAINED" "$RANDOM_M"; do
  [ -f "$f" ] || continue
  name=$(basename "$f" .gguf)
  p=$("$MOLE" perplexity -m "$f" -f "$TEXT" -c 512 -t "$THREADS" 2>/dev/null | final)
  row "$name" "ppl_mole" "$p"
  if [ -n "$PPL_BIN" ]; then
    # llama-perplexity: the same counting; KV in f16 on both sides (both defaults), flash attention off
    q=$("$PPL_BIN" -m "$f" -f "$TEXT" -c 512 -b 512 -t "$THREADS" -fa off 2>&1 | final)
    row "$name" "ppl_llama.cpp" "$q"
    row "$name" "ppl_mole/llama.cpp-1" "$(awk -v a="$p" -v b="$q" 'BEGIN { printf "%.2e", a / b - 1 }')"
  fi
done

echo "== routing realism and the expert cache: $NGEN generated tokens after a held-out prompt"
head -c 1200 "$TEXT" >"$OUT/eval-prompt.txt"
for f in "$TRAINED" "$RANDOM_M"; do
  name=$(basename "$f" .gguf)
  "$MOLE" run -m "$f" -f "$OUT/eval-prompt.txt" -n "$NGEN" --seed 1 --temp 0.8 --ignore-eos -t "$THREADS" \
    --trace-routing "$OUT/eval-$name.trace" --stats >/dev/null 2>"$OUT/eval-$name.stats" || {
    echo "run failed: $(tail -3 "$OUT/eval-$name.stats")"
    exit 1
  }
  acc=$(sed -n 's/.*prediction accuracy \([0-9.]*\)%.*/\1/p' "$OUT/eval-$name.stats" | head -1)
  row "$name" "predictor_accuracy_pct" "$acc"
  for b in 25% 50%; do
    "$MOLE" cachesim --trace "$OUT/eval-$name.trace" --budget $b --cache-policy all --json >"$OUT/eval-$name-$b.json"
    python3 - "$name" "$b" "$OUT/eval-$name-$b.json" "$TSV" <<'PY'
import json, sys
name, b, path, tsv = sys.argv[1:5]
rows = [json.loads(l) for l in open(path) if l.strip()]
with open(tsv, "a") as f:
    for r in rows:
        line = f"{name}\thit_rate@{b}:{r['policy']}\t{r['hit_rate']:.4f}"
        print(line)
        f.write(line + "\n")
PY
  done
done
