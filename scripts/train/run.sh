#!/usr/bin/env bash
# The whole evaluation model, from Debian's packages to the files in eval-model/ (make eval-model):
#   corpus -> BPE -> training (about an hour on 2 cores) -> GGUF (F32, F16, Q8_0) -> the trainer's
#   logits fixture -> tokenizer vectors -> held-out figures and the loss curve.
# OUT (default models/eval) keeps every intermediate; COMMIT=1 copies what eval-model/ holds.
# Python is Debian's (/usr/bin/python3), where python3-torch lives.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-models/eval}
PY=/usr/bin/python3
STEPS=${STEPS:-960}
mkdir -p "$OUT"
$PY scripts/train/corpus.py "$OUT"
$PY scripts/train/bpe.py train "$OUT/train.txt" 4096 "$OUT/tok.json"
if [ ! -f "$OUT/ckpt.pt" ] || [ "${RETRAIN:-1}" = 1 ]; then
  $PY scripts/train/train.py "$OUT" --steps "$STEPS" 2>&1 | tee "$OUT/train.log" >&2
fi
for t in f32 f16 q8_0; do
  $PY scripts/train/export.py "$OUT" $t "$OUT/mole-eval-moe-$t.gguf" $([ $t = q8_0 ] && echo --fixture "$OUT/fixture")
done
$PY scripts/train/tokvectors.py "$OUT" "$OUT/mole-eval-moe-q8_0.gguf"
$PY scripts/train/evaluate.py "$OUT" -c 512 | tee "$OUT/eval.txt"
sha256sum "$OUT"/mole-eval-moe-*.gguf
if [ "${COMMIT:-0}" = 1 ]; then
  cp "$OUT/mole-eval-moe-q8_0.gguf" "$OUT/loss.png" "$OUT/tokenizer.inp" "$OUT/tokenizer.out" "$OUT/heldout.txt" "$OUT/eval.json" eval-model/
  cp "$OUT/fixture/eval-logits.f32" eval-model/logits.f32
  cp "$OUT/fixture/eval-tokens.txt" eval-model/tokens.txt
fi
