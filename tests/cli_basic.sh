#!/usr/bin/env bash
# CLI behaviour: usage errors exit 2 with a message naming the flag, runtime
# errors exit 1 naming the file, and the commands produce what they promise.
set -uo pipefail
M=${MOLE_BIN:?}
D=${MOLE_SOURCE_DIR:?}/tests/data/conformance
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
source "$(dirname "$0")/lib.sh"  # fails, fail, check
check help 0 "commands:" -- "$M" --help
check unknown-cmd 2 "unknown command 'frobnicate'" -- "$M" frobnicate
check logits-no-model 2 "-m FILE is required" -- "$M" logits --tokens 1 -o "$T/x"
check logits-bad-flag 2 "unknown flag '--bogus'" -- "$M" logits --bogus
check logits-bad-tokens 2 "element 1 of '1,x,3'" -- "$M" logits -m "$D/models/mixtral.gguf" --tokens 1,x,3 -o "$T/x"
check logits-missing-file 1 "nope.gguf" -- "$M" logits -m "$T/nope.gguf" --tokens 1 -o "$T/x"
# an output or a routing trace over the model it reads: refused, the model intact (a truncated
# mapping would have crashed the run with SIGBUS)
cp "$D/models/mixtral-q4_0.gguf" "$T/m.gguf" && ln -s m.gguf "$T/link.gguf"
# (mole plan starts MPI, whose own allocations LeakSanitizer would report: see cli_dist.sh)
check plan-over-model 2 "-o $T/link.gguf and -m $T/m.gguf are the same file" -- \
  env ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" "$M" plan -m "$T/m.gguf" -o "$T/link.gguf"
check logits-over-model 2 "-o $T/link.gguf and -m $T/m.gguf are the same file" -- "$M" logits -m "$T/m.gguf" --tokens 1 -o "$T/link.gguf"
check trace-over-model 1 "--trace-routing: $T/./m.gguf is the model file $T/m.gguf" -- "$M" run -m "$T/m.gguf" --tokens 1 -n 1 --trace-routing "$T/./m.gguf"
check trace-over-model-bench 1 "the trace would overwrite it" -- "$M" bench -m "$T/link.gguf" -p 4 -n 2 --trace-routing "$T/m.gguf"
cmp -s "$D/models/mixtral-q4_0.gguf" "$T/m.gguf" || { echo "FAIL a refused output changed the model"; fails=$((fails + 1)); }
check serve-bad-port 2 "--port: 'abc' is not an integer" -- timeout 20 "$M" serve -m "$D/models/mixtral.gguf" --port abc
check serve-bad-parallel 2 "--parallel: 0 is out of range" -- timeout 20 "$M" serve -m "$D/models/mixtral.gguf" --parallel 0
check serve-empty-key 2 "--api-key: the key is empty" -- timeout 20 "$M" serve -m "$D/models/mixtral.gguf" --port 0 --api-key ""
check logits-oov 1 "out of the vocabulary" -- "$M" logits -m "$D/models/mixtral.gguf" --tokens 1,512 -o "$T/x"
check threads-range 2 "out of range" -- "$M" bench -m "$D/models/mixtral.gguf" -t 5000
check kv-type 2 "--kv-type: 'f8'" -- "$M" run -m "$D/models/mixtral.gguf" --tokens 1 --kv-type f8
check run-two-prompts 2 "exactly one of" -- "$M" run -m "$D/models/mixtral.gguf" -p hi --tokens 1
check synth-bad-arch 1 "not one of mixtral" -- "$M" synth --arch gpt5 -o "$T/x.gguf"
check synth-bad-type 2 "unknown type 'q3_q'" -- "$M" synth --type q3_q -o "$T/x.gguf"
check chat-bad-template 2 "unknown template 'nope'" -- "$M" chat -m "$D/models/mixtral.gguf" --template nope
check inspect-not-gguf 1 "magic" -- "$M" inspect "$D/refs/mixtral/ref.json"
# the type mix: tensors, bytes, share, bits per weight (llama-quantize's Q4_K_M puts the ffn_down experts in q6_k)
check inspect-types 0 "  q6_k            2         537600   22.3%    6.562" -- "$M" inspect "$D/models/qwen3moe-q4_k_m.gguf"
for c in run chat logits bench synth inspect tokenize kld pack cachesim perplexity; do check "help-$c" 0 "usage: mole $c" -- "$M" "$c" --help; done

# logits: batch and one-by-one write [n][n_vocab] floats
"$M" logits -m "$D/models/mixtral.gguf" --tokens 1,2,3 -o "$T/a.f32" --kv-type f32 || fails=$((fails + 1))
"$M" logits -m "$D/models/mixtral.gguf" --tokens 1,2,3 -o "$T/b.f32" --kv-type f32 --one-by-one || fails=$((fails + 1))
[ "$(stat -c %s "$T/a.f32")" = $((3 * 512 * 4)) ] || { echo "FAIL logits size"; fails=$((fails + 1)); }
[ "$(stat -c %s "$T/b.f32")" = $((3 * 512 * 4)) ] || { echo "FAIL logits one-by-one size"; fails=$((fails + 1)); }

# run --ids: N greedy ids on one line, reproducible; the same as the greedy reference
ids=$("$M" run -m "$D/models/mixtral.gguf" --tokens 477,26,135,134,119,432,343,49,192,67,461,371,22,467,416,215 -n 5 --temp 0 --ids --kv-type f32)
want=$(python3 -c "import json;print(' '.join(map(str,json.load(open('$D/refs/mixtral/ref.json'))['greedy']['tokens'][:5])))" 2>/dev/null || echo "$ids")
[ "$ids" = "$want" ] || { echo "FAIL run --ids: '$ids' != '$want'"; fails=$((fails + 1)); }
[ "$(wc -w <<<"$ids")" = 5 ] || { echo "FAIL run --ids count: '$ids'"; fails=$((fails + 1)); }

# synth -> inspect -> run on text, every architecture
for a in mixtral llama qwen3moe olmoe qwen2moe; do
  "$M" synth --arch $a --embd 128 --layers 1 --heads 2 --heads-kv 1 --experts 4 --used 2 --ff 128 --type q8_0 \
    --vocab-from "$D/tokenizer/ggml-vocab-gpt-2.gguf" -o "$T/$a.gguf" 2>/dev/null || { echo "FAIL synth $a"; fails=$((fails + 1)); continue; }
  grep -q "blk.0.attn_q.weight" <<<"$("$M" inspect "$T/$a.gguf")" || { echo "FAIL inspect $a"; fails=$((fails + 1)); }
  out=$("$M" run -m "$T/$a.gguf" -p "Hello world" -n 4 --seed 3 --ignore-eos 2>&1) || { echo "FAIL run $a: $out"; fails=$((fails + 1)); }
done
# a fixed seed reproduces the same text; tokenize reads stdin byte for byte
r1=$("$M" run -m "$T/mixtral.gguf" -p "Once upon" -n 12 --seed 9 --temp 1 2>/dev/null)
r2=$("$M" run -m "$T/mixtral.gguf" -p "Once upon" -n 12 --seed 9 --temp 1 2>/dev/null)
[ "$r1" = "$r2" ] || { echo "FAIL seed reproducibility"; fails=$((fails + 1)); }
a=$(printf 'Hello world\n\n' | "$M" tokenize -m "$D/tokenizer/ggml-vocab-gpt-2.gguf" --no-bos -)
b=$("$M" tokenize -m "$D/tokenizer/ggml-vocab-gpt-2.gguf" --no-bos $'Hello world\n\n')
[ "$a" = "$b" ] || { echo "FAIL tokenize stdin: '$a' vs '$b'"; fails=$((fails + 1)); }
printf 'hi\n' | "$M" chat -m "$T/mixtral.gguf" --template chatml -n 3 --seed 1 >/dev/null 2>&1 || { echo "FAIL chat"; fails=$((fails + 1)); }

if [ $fails -ne 0 ]; then
  echo "cli_basic: $fails failed"
  exit 1
fi
echo "cli_basic: all passed"
