#!/usr/bin/env bash
# `make run`: the trained evaluation model (eval-model/, a 6-layer, 16-expert MoE that
# learned English definitions and quotations from Debian's dictionaries and fortunes)
# generates from a prompt with half of its experts held in RAM, the rest read from
# disk on demand, and prints what the expert cache did.
# DEMO=FILE runs another model; without eval-model/ (a partial checkout), a random-weight
# Mixtral-shaped model is synthesized under models/ instead.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${1:-eval-model/mole-eval-moe-q8_0.gguf}
MOLE=${MOLE:-build/mole}
PROMPT=${PROMPT:-"lighthouse (noun):"}
if [ ! -f "$MODEL" ]; then
  MODEL=models/demo-mixtral-q4_0.gguf
  PROMPT="Once upon a time"
  if [ ! -f "$MODEL" ]; then
    mkdir -p "$(dirname "$MODEL")"
    echo "demo: synthesizing $MODEL (random weights, Mixtral layout, 8 experts top-2, Q4_0: the text is noise)"
    "$MOLE" synth --arch mixtral --embd 512 --layers 8 --experts 8 --used 2 --ff 1408 --type q4_0 \
      --vocab-from tests/data/conformance/tokenizer/ggml-vocab-llama-spm.gguf --seed 1 -o "$MODEL.tmp"
    mv "$MODEL.tmp" "$MODEL"
  fi
fi
echo "demo: $MOLE run -m $MODEL -p \"$PROMPT\" -n 64 --seed 1 --expert-budget 50% --stats"
"$MOLE" run -m "$MODEL" -p "$PROMPT" -n 64 --seed 1 --expert-budget 50% --stats
