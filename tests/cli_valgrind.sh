#!/usr/bin/env bash
# valgrind on the loaders and one decode: load + prefill + one decode step of
# a quantized and an f32 model, and the GGUF/tokenizer loaders, with no error.
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
$VG "$M" tokenize -m "$D/tokenizer/ggml-vocab-gpt-2.gguf" "Hello world, valgrind!" >/dev/null || rc=1
[ $rc = 0 ] && echo "valgrind: clean"
exit $rc
