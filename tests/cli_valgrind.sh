#!/usr/bin/env bash
# valgrind on the loaders and one decode: load + prefill + one decode step of
# a quantized and an f32 model, the GGUF/tokenizer loaders, mole compress and
# a compressed model's load, mole train-retain, a heads file's load and
# bounded caches that evict, with no error.
set -uo pipefail
M=${MOLE_BIN:?}
D=${MOLE_SOURCE_DIR:?}/tests/data/conformance
command -v valgrind >/dev/null || { echo "valgrind not installed"; exit 1; }
[ "${MOLE_ASAN:-0}" = 1 ] && { echo "skipped under ASan (valgrind runs in the release build)"; exit 0; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
VG="valgrind -q --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite"
rc=0
$VG "$M" logits -m "$D/models/mixtral-q4_k_m.gguf" --tokens 1,2,3 -o "$T/a" --one-by-one -t 2 || rc=1
$VG "$M" logits -m "$D/models/qwen2moe.gguf" --tokens 5,6 -o "$T/b" -t 1 || rc=1
$VG "$M" inspect "$D/models/olmoe.gguf" >/dev/null || rc=1
# a compressed model (mole compress, round to nearest: quick): the dictionary
# and blob checks at load, resident and offloaded, and the compressor itself
"$M" synth --arch mixtral --embd 128 --layers 2 --heads 4 --heads-kv 2 --experts 4 --used 2 --ff 192 --type q8_0 \
  --vocab 1000 --ctx 256 -o "$T/m.gguf" >/dev/null 2>&1 || rc=1
$VG "$M" compress "$T/m.gguf" -o "$T/t.gguf" --rtn -t 1 >/dev/null 2>&1 || rc=1
$VG "$M" logits -m "$T/t.gguf" --tokens 1,2,3 -o "$T/c" -t 1 || rc=1
# (pread: valgrind cannot see the kernel fill io_uring buffers)
$VG "$M" logits -m "$T/t.gguf" --tokens 1,2,3 -o "$T/d" -t 1 --expert-budget 50% --io pread || rc=1
$VG "$M" tokenize -m "$D/tokenizer/ggml-vocab-gpt-2.gguf" "Hello world, valgrind!" >/dev/null || rc=1
# retaining heads: the trainer, the heads file's loader, and a locret cache that evicts (decode included)
seq 1 400 | tr '\n' ' ' >"$T/text.txt"
$VG "$M" train-retain -m "$T/m.gguf" --data "$T/text.txt" --tokens 256 --seq-len 64 --window 8 --hidden 8 --batch 32 \
  --epochs 1 -t 1 -o "$T/h.gguf" >/dev/null 2>&1 || rc=1
$VG "$M" run -m "$T/m.gguf" --tokens "$(seq -s, 3 1 60)" -n 4 --ids --ignore-eos -t 1 -b 8 --kv-budget 16 \
  --retain "$T/h.gguf" >/dev/null || rc=1
$VG "$M" run -m "$T/m.gguf" --tokens "$(seq -s, 3 1 60)" -n 4 --ids --ignore-eos -t 2 -b 8 --kv-budget 16 \
  --kv-policy h2o >/dev/null || rc=1
[ $rc = 0 ] && echo "valgrind: clean"
exit $rc
