#!/usr/bin/env bash
# `make bench-kv`, part 2: what a bounded KV cache costs in quality, on the
# trained evaluation model (eval-model/, context 1024) and its held-out text.
#
# Retaining heads: mole train-retain on the model's training corpus
# (models/eval/train.txt, made by scripts/train/corpus.py when missing; never
# the held-out text), kept in models/eval/retain-heads.gguf with its loss
# curve in bench/out/retain_loss.png and its report (held-out loss, top-10%
# overlap of each policy's scores with the true labels) in
# bench/out/retain_report.json.
# Then mole perplexity over the held-out text in chunks of $CTX tokens
# (the second half of each scored, as llama-perplexity does) with budgets of
# CTX/4 and CTX/16 entries per layer and KV head, prefill chunk budget/4,
# recent budget/4, sinks 4, for streaming, h2o and locret (its default age
# decay of 8/budget per position, and locret-fixed: --kv-decay 0, the paper's
# fixed scores); each against the
# same model with the full cache (--ref): perplexity, KL(full || bounded)
# and top-1 agreement.
# Output: bench/out/kv_quality.tsv and a markdown table on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
MOLE=${MOLE:-build/mole}
THREADS=${THREADS:-2}
CTX=${CTX:-1024}
M=${MODEL:-eval-model/mole-eval-moe-q8_0.gguf}
TEXT=${TEXT:-eval-model/heldout.txt}
HEADS=${HEADS:-models/eval/retain-heads.gguf}
POLICIES=${POLICIES:-"streaming h2o locret locret-fixed"}
TRAIN_FLAGS=${TRAIN_FLAGS:-}
mkdir -p bench/out models/eval

cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
l3=$(lscpu 2>/dev/null | sed -n 's/^L3 cache:[[:space:]]*//p' | head -1)
echo "CPU: ${cpu:-unknown}; L3: ${l3:-unknown}; $THREADS threads; model $M, context $CTX"

if [[ " $POLICIES " == *" locret "* ]] && [ ! -f "$HEADS" ]; then
  if [ ! -f models/eval/train.txt ]; then
    python3 scripts/train/corpus.py models/eval/corpus >&2
    cp models/eval/corpus/train.txt models/eval/train.txt
  fi
  # shellcheck disable=SC2086
  "$MOLE" train-retain -m "$M" --data models/eval/train.txt -o "$HEADS.tmp" -t "$THREADS" \
    --png bench/out/retain_loss.png --csv bench/out/retain_loss.csv --report bench/out/retain_report.json \
    $TRAIN_FLAGS >&2
  mv "$HEADS.tmp" "$HEADS"
fi

out=bench/out/kv_quality.tsv
printf "budget\tfraction\tpolicy\tppl\tkl\tkl_err\ttop1_pct\n" > "$out"
full=$("$MOLE" perplexity -m "$M" -f "$TEXT" -c "$CTX" -t "$THREADS" 2>/dev/null |
  sed -n 's/^Final estimate: PPL = \([0-9.]*\).*/\1/p')
printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$CTX" "1" full "$full" 0 0 100 | tee -a "$out"
for frac in 4 16; do
  b=$((CTX / frac))
  chunk=$((b / 4))
  for p in $POLICIES; do
    extra=(--kv-budget "$b" --kv-policy "${p%-fixed}" -b "$chunk")
    [ "${p%-fixed}" = locret ] && extra+=(--retain "$HEADS")
    [ "$p" = locret-fixed ] && extra+=(--kv-decay 0)
    r=$("$MOLE" perplexity -m "$M" -f "$TEXT" -c "$CTX" -t "$THREADS" "${extra[@]}" --ref "$M" 2>/dev/null)
    ppl=$(sed -n 's/^Final estimate: PPL = \([0-9.]*\).*/\1/p' <<<"$r")
    read -r kl klerr top1 < <(sed -n 's/^KL divergence vs .*: \([0-9.]*\) +\/- \([0-9.]*\), top-1 agreement \([0-9.]*\)%.*/\1 \2 \3/p' <<<"$r")
    printf "%s\t1/%s\t%s\t%s\t%s\t%s\t%s\n" "$b" "$frac" "$p" "$ppl" "$kl" "$klerr" "$top1" | tee -a "$out"
  done
done

echo
echo "| budget | policy | perplexity | KL vs full cache | top-1 agreement |"
echo "|---|---|---|---|---|"
tail -n +2 "$out" | while IFS=$'\t' read -r b f p ppl kl klerr top1; do
  echo "| $b ($f) | $p | $ppl | $kl ± $klerr | $top1% |"
done
