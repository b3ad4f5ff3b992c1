#!/usr/bin/env bash
# `make run`: synthesize a small Mixtral-shaped demo model once (cached under
# models/), then generate from a text prompt with statistics.
# The weights are random: the text is noise; the speed and memory are real.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-models/demo-mixtral-q4_0.gguf}
MOLE=${MOLE:-build/mole}
if [ ! -f "$MODEL" ]; then
  mkdir -p "$(dirname "$MODEL")"
  echo "demo: synthesizing $MODEL (random weights, Mixtral layout, 8 experts top-2, Q4_0)"
  "$MOLE" synth --arch mixtral --embd 512 --layers 8 --experts 8 --used 2 --ff 1408 --type q4_0 \
    --vocab-from tests/data/conformance/tokenizer/ggml-vocab-llama-spm.gguf --seed 1 -o "$MODEL.tmp"
  mv "$MODEL.tmp" "$MODEL"
fi
echo "demo: $MOLE run -m $MODEL -p \"Once upon a time\" -n 64 --seed 1 --expert-budget 50% --stats"
"$MOLE" run -m "$MODEL" -p "Once upon a time" -n 64 --seed 1 --expert-budget 50% --stats
