#!/usr/bin/env bash
# mole compress (QMoE) from the CLI: flag errors; GPTQ ternary and 2-bit and
# RTN runs on a small model with a report; the compressed file runs resident and
# offloaded with the same logits, and close to the source's; mole pack --low
# takes it as the low tier; hostile compressed files are errors, not crashes.
set -uo pipefail
M=${MOLE_BIN:?}
S=${MOLE_SOURCE_DIR:?}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
source "$(dirname "$0")/lib.sh"  # fails, fail, check

"$M" synth --arch mixtral --embd 128 --layers 2 --heads 4 --heads-kv 2 --experts 4 --used 2 --ff 192 --type f16 \
  --vocab 1000 --ctx 256 -o "$T/m.gguf" >/dev/null 2>&1 || { echo "FAIL synth"; exit 1; }
CAL=$S/README.md
C=(compress "$T/m.gguf" --calib "$CAL" --calib-tokens 2048 --seq-len 128)

check help 0 "--calib TEXT" -- "$M" compress --help
check no-out 2 "-o FILE is required" -- "$M" compress "$T/m.gguf" --calib "$CAL"
check no-calib 2 "--calib TEXT is required" -- "$M" compress "$T/m.gguf" -o "$T/x.gguf"
check bad-bits 2 "--bits '3': expected ternary or 2" -- "$M" "${C[@]}" -o "$T/x.gguf" --bits 3
check bad-damp 2 "--damp" -- "$M" "${C[@]}" -o "$T/x.gguf" --damp -1
check bad-dz 2 "--dead-zone: 1.5 is out of range" -- "$M" "${C[@]}" -o "$T/x.gguf" --dead-zone 1.5
check bad-cw-odd 2 "--code-weights 33: must be even" -- "$M" "${C[@]}" -o "$T/x.gguf" --code-weights 33
check bad-cw-range 2 "--code-weights: 66 is out of range" -- "$M" "${C[@]}" -o "$T/x.gguf" --code-weights 66
check bad-cw-word 2 "--code-weights: 'wide' is not an integer" -- "$M" "${C[@]}" -o "$T/x.gguf" --code-weights wide
check bad-cw-2bit 2 "--code-weights is for the ternary grid" -- "$M" "${C[@]}" -o "$T/x.gguf" --bits 2 --code-weights 32
check bad-flag 2 "unknown flag '--gptq'" -- "$M" "${C[@]}" -o "$T/x.gguf" --gptq
check missing-calib 1 "cannot open '$T/nope.txt'" -- "$M" compress "$T/m.gguf" -o "$T/x.gguf" --calib "$T/nope.txt"
check dense 1 "a dense model" -- "$M" compress "$S/tests/data/conformance/models/llama-dense.gguf" -o "$T/x.gguf" --rtn
check same-file 2 "-o $T/m.gguf and the input $T/m.gguf are the same file" -- "$M" compress "$T/m.gguf" -o "$T/m.gguf" --rtn
# an output over an input however it is spelled (./, a link): refused, the input intact
cp "$CAL" "$T/cal.txt" && ln -s m.gguf "$T/link.gguf" && sum0=$(cat "$T/m.gguf" "$T/cal.txt" | md5sum)
check same-file-dot 2 "are the same file" -- "$M" compress "$T/m.gguf" -o "$T/./m.gguf" --rtn
check same-file-link 2 "-o $T/link.gguf and the input $T/m.gguf are the same file" -- "$M" compress "$T/m.gguf" -o "$T/link.gguf" --rtn
check same-file-calib 2 "-o $T/cal.txt and --calib $T/cal.txt are the same file" -- "$M" compress "$T/m.gguf" -o "$T/cal.txt" --calib "$T/cal.txt"
[ "$(cat "$T/m.gguf" "$T/cal.txt" | md5sum)" = "$sum0" ] || fail "a refused output changed an input"

check gptq-ternary 0 "bits per weight" -- "$M" "${C[@]}" -o "$T/t.gguf"
check gptq-cw-auto 0 "(auto: 64 would" -- "$M" "${C[@]}" -o "$T/tauto.gguf" --code-weights auto
check gptq-cw-64 0 "codes of up to 64 weights" -- "$M" "${C[@]}" -o "$T/t64.gguf" --code-weights 64
check gptq-cw-2 0 "9 entries, 27 bytes, codes of up to 2 weights" -- "$M" "${C[@]}" -o "$T/t2w.gguf" --code-weights 2
cmp -s "$T/t.gguf" "$T/tauto.gguf" || fail "--code-weights auto is not the default"
check gptq-act-order 0 "act order" -- "$M" "${C[@]}" -o "$T/ta.gguf" --act-order
check gptq-2bit 0 "2-bit grid" -- "$M" "${C[@]}" -o "$T/t2.gguf" --bits 2
check rtn 0 "round-to-nearest" -- "$M" compress "$T/m.gguf" -o "$T/r.gguf" --rtn
check inspect 0 "mole.tq.dictionary" -- "$M" inspect "$T/t.gguf"
check again 1 "compress the source GGUF" -- "$M" compress "$T/t.gguf" -o "$T/x.gguf" --rtn
# deterministic
"$M" "${C[@]}" -o "$T/t-again.gguf" >/dev/null 2>&1 && cmp -s "$T/t.gguf" "$T/t-again.gguf" || fail "compress is not deterministic"

TOK=5,17,300,42,999,7,123,64,1,2,3,4
# the same ternary weights coded with runs of up to 2 and up to 64 weights
# (two dictionaries): the same logits, bit for bit
for f in t2w t64; do
  "$M" logits -m "$T/$f.gguf" --tokens $TOK -o "$T/$f.f32" --one-by-one || fail "$f: logits"
  "$M" logits -m "$T/$f.gguf" --tokens $TOK -o "$T/$f-batch.f32" || fail "$f: batched logits"
done
cmp -s "$T/t2w.f32" "$T/t64.f32" || fail "code widths 2 and 64 give different logits"
cmp -s "$T/t2w-batch.f32" "$T/t64-batch.f32" || fail "code widths 2 and 64 give different batched logits"
for f in t t2 r; do
  # (the same chunking on both sides: an f16 model's prefill and decode differ, as in llama.cpp)
  "$M" logits -m "$T/$f.gguf" --tokens $TOK -o "$T/$f-res.f32" --expert-budget 0 --one-by-one || fail "$f: resident logits"
  "$M" logits -m "$T/$f.gguf" --tokens $TOK -o "$T/$f-off.f32" --expert-budget 50% --one-by-one || fail "$f: offloaded logits"
  cmp -s "$T/$f-res.f32" "$T/$f-off.f32" || fail "$f: offloaded logits differ from resident"
done
# on the trained evaluation model, GPTQ beats round-to-nearest on the same grid
# (held-out perplexity; calibrated on the repository's documentation, not on it)
E=$S/eval-model/mole-eval-moe-q8_0.gguf
cat "$S/README.md" "$S"/docs/*.md >"$T/cal.txt"
ppl() { "$M" perplexity -m "$1" -f "$S/eval-model/heldout.txt" -c 512 --chunks 3 2>/dev/null | sed -n 's/.*Final estimate: PPL = \([0-9.]*\).*/\1/p'; }
if "$M" compress "$E" -o "$T/eg.gguf" --calib "$T/cal.txt" --calib-tokens 2048 >/dev/null 2>&1 &&
  "$M" compress "$E" -o "$T/er.gguf" --rtn >/dev/null 2>&1; then
  pg=$(ppl "$T/eg.gguf") pr=$(ppl "$T/er.gguf") p8=$(ppl "$E")
  echo "eval model, 3 chunks: ppl q8_0 $p8, GPTQ ternary $pg, RTN ternary $pr"
  python3 -c 'import sys; q,g,r=map(float,sys.argv[1:]); sys.exit(0 if q < g < r else 1)' "$p8" "$pg" "$pr" ||
    fail "eval model: want ppl q8_0 < GPTQ < RTN (got $p8, $pg, $pr)"
else
  fail "compress the eval model"
fi

# as the low tier of a packed store
check pack-low 0 "" -- "$M" pack "$T/m.gguf" -o "$T/p.gguf" --high q8_0 --low "$T/t.gguf"
check pack-low-inspect 0 "mole.pack.low.types" -- "$M" inspect "$T/p.gguf"
"$M" logits -m "$T/p.gguf" --tokens $TOK -o "$T/p-hi.f32" || fail "packed high"
"$M" logits -m "$T/p.gguf" --tokens $TOK -o "$T/p-mix.f32" --t1 0 --t2 1 || fail "packed mixed"
"$M" logits -m "$T/p.gguf" --tokens $TOK -o "$T/p-mix-off.f32" --t1 0 --t2 1 --expert-budget 50% || fail "packed mixed offloaded"
cmp -s "$T/p-mix.f32" "$T/p-mix-off.f32" || fail "packed mixed: offloaded differs from resident"
cmp -s "$T/p-hi.f32" "$T/p-mix.f32" && fail "the compressed low tier changed nothing"
check pack-low-mismatch 1 "but" -- "$M" pack "$S/tests/data/conformance/models/mixtral.gguf" -o "$T/x.gguf" --low "$T/t.gguf"
# a plain model of the same shapes is a low tier too (its experts as they are; here the source itself)
check pack-low-plain 0 "" -- "$M" pack "$T/m.gguf" -o "$T/x.gguf" --low "$T/m.gguf"

# blobs larger than the weights image's 1 MiB work chunks (a regression: the
# image copied only the first chunk): the image and the mapping agree
"$M" synth --arch mixtral --embd 2048 --layers 1 --heads 16 --heads-kv 4 --experts 2 --used 2 --ff 4096 --type q4_0 \
  --vocab 1000 --ctx 256 -o "$T/big.gguf" >/dev/null 2>&1 || fail "synth big"
if "$M" compress "$T/big.gguf" -o "$T/big-tq.gguf" --rtn >/dev/null 2>&1; then
  "$M" logits -m "$T/big-tq.gguf" --tokens 1,2,3 -o "$T/big-img.f32" || fail "big blobs: logits from the image"
  "$M" logits -m "$T/big-tq.gguf" --tokens 1,2,3 -o "$T/big-map.f32" --mmap || fail "big blobs: logits from the mapping"
  cmp -s "$T/big-img.f32" "$T/big-map.f32" || fail "big blobs: image and mapping differ"
else
  fail "compress big"
fi

# hostile files: the last region (the file's last bytes) with a group index
# pointing past its codes
R=$("$M" inspect "$T/t.gguf" | awk '$2 == "blk.1.ffn_exps.3.high" {print $NF}')
python3 - "$T/t.gguf" "$T/bad-code.gguf" "${R:-0}" <<'PY' || fail "corrupt a region"
import sys
b=bytearray(open(sys.argv[1],"rb").read()); r=int(sys.argv[3])
assert r > 0 and r % 4096 == 0
at=len(b)-r
b[at+4:at+8]=b"\xff\xff\xff\x7f"  # gidx[1] of the gate matrix
open(sys.argv[2],"wb").write(b)
PY
check bad-code-res 1 "matrix:" -- "$M" logits -m "$T/bad-code.gguf" --tokens $TOK -o "$T/x.f32" --expert-budget 0
check bad-code-off 1 "matrix:" -- "$M" logits -m "$T/bad-code.gguf" --tokens $TOK -o "$T/x.f32" --expert-budget 50%

echo "cli_compress: $fails failures"
[ "$fails" = 0 ]
