#!/usr/bin/env bash
# Fuzzes the GGUF reader, the dictionary/blob checks of compressed experts
# (fuzz_tq, FUZZ_TQ_SECONDS, default 30) and whole models (fuzz_model: the
# tokenizer, the model loader and a forward pass, resident and with the
# experts offloaded; FUZZ_MODEL_SECONDS, default 30; its seeds come from
# build/mole synth): builds them with clang (libFuzzer, ASan+UBSan)
# in build-fuzz, seeds a corpus from the small conformance GGUF files plus a
# few hand-made ones, and runs it for FUZZ_SECONDS (default 60). Fails on any
# crash, leak or sanitizer report; quiet on success apart from one line.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-60}
build=build-fuzz
mkdir -p "$build"
log=$build/fuzz-build.log
if ! { CC=clang cmake -S . -B "$build" -DMOLE_FUZZ=ON -DMOLE_SANITIZE=ON -DCMAKE_BUILD_TYPE=Release \
         -DCMAKE_C_FLAGS="-fsanitize=fuzzer-no-link" &&
       cmake --build "$build" -j "$(nproc)" --target fuzz_gguf fuzz_tq fuzz_model; } >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "fuzz: building the fuzzers failed (full log: $log)" >&2
  exit 1
fi

corpus=$build/corpus-gguf
mkdir -p "$corpus"
for f in tests/data/conformance/models/*.gguf tests/data/conformance/tokenizer/*.gguf; do
  [ -f "$f" ] || continue
  if [ "$(stat -c %s "$f")" -le 2097152 ]; then cp -f "$f" "$corpus/seed-$(basename "$f")"; fi
done
# Tiny hand-made seeds: the mutator works best on small inputs.
le32() { printf "$(printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 & 255)) $(($1 >> 8 & 255)) $(($1 >> 16 & 255)) $(($1 >> 24 & 255)))"; }
le64() { le32 $(($1 & 0xffffffff)); le32 $(($1 >> 32 & 0xffffffff)); }
str() { le64 ${#1}; printf '%s' "$1"; }
{ printf 'GGUF'; le32 3; le64 2; le64 4
  str general.architecture; le32 8; str llama
  str general.alignment; le32 4; le32 64
  str tokenizer.ggml.tokens; le32 9; le32 8; le64 3; str '<s>'; str ''; str hello
  str llama.ids; le32 9; le32 5; le64 2; le32 7; le32 9
  str a; le32 2; le64 8; le64 1; le32 0; le64 0
  str b; le32 1; le64 32; le32 2; le64 64
} >"$corpus/seed-tiny-tensors.gguf"
pad=$(( (64 - $(stat -c %s "$corpus/seed-tiny-tensors.gguf") % 64) % 64 ))
head -c $((pad + 64 + 18)) /dev/zero >>"$corpus/seed-tiny-tensors.gguf"
{ printf 'GGUF'; le32 2; le64 0; le64 3
  str k.u8; le32 0; printf 'x'
  str k.f64; le32 12; le64 0
  str k.bools; le32 9; le32 7; le64 2; printf '\x01\x00'
} >"$corpus/seed-tiny-kv.gguf"

# run_fuzzer NAME CORPUS SECONDS MAX_LEN: fails on any crash, leak or sanitizer report
run_fuzzer() {
  local name=$1 corp=$2 t=$3 max_len=$4 log=$build/$1-run.log rc execs
  set +e
  "$build/$name" "$corp" -max_total_time="$t" -max_len="$max_len" -timeout=20 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$build/crash-$name-" >"$log" 2>&1
  rc=$?
  set -e
  if [ $rc -ne 0 ]; then
    tail -n 60 "$log" >&2
    echo "fuzz: $name FAILED (exit $rc); the input is saved as $build/crash-$name-*; full log: $log" >&2
    exit 1
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  echo "fuzz: $name ran ${t}s, ${execs:-?} inputs, corpus $(ls "$corp" | wc -l) files, no crashes"
}
run_fuzzer fuzz_gguf "$corpus" "$secs" 2097152

# fuzz_tq: seeds are valid inputs (a dictionary of the 9 one-pair runs and a
# few longer ones, and a blob of 3 rows; a dictionary with a run of 20 pairs and
# a blob of 2 rows; one with runs of up to 15 pairs and a row of 64 weights),
# from which the mutator starts
secs_tq=${FUZZ_TQ_SECONDS:-30}
corpus_tq=$build/corpus-tq
mkdir -p "$corpus_tq"
python3 - "$corpus_tq" <<'PY'
import struct,sys
d=sys.argv[1]
book=b"".join(struct.pack("<HB",0,s) for s in range(9)) + struct.pack("<HB",4+1,4) + struct.pack("<HB",9+1,4)
n=len(book)//3
# 3 rows of k=8 (4 pairs): codes per row: [entry 10 = 3 zero pairs, symbol 0], [0,1,2,3], [9 = 2 zero pairs, 9]
codes=[10,0, 0,1,2,3, 9,9]
blob=struct.pack("<II",0,len(codes)) + struct.pack("<HHH",0x3c00,0x4000,0x3800) + struct.pack("<%dH"%len(codes),*codes)
open(d+"/seed-3x8","wb").write(bytes([2,3])+struct.pack("<H",n)+book+blob)
# a wide book (a run of 20 zero pairs: the 512-bit kernels), 2 rows of k=40
book=b"".join(struct.pack("<HB",0,s) for s in range(9)) + struct.pack("<HB",4+1,4)
book+=b"".join(struct.pack("<HB",9+j,4) for j in range(1,19))  # entry 9+j: j+2 zero pairs
n=len(book)//3
codes=[27, 0,26]
blob=struct.pack("<II",0,len(codes)) + struct.pack("<HH",0x3c00,0x4000) + struct.pack("<%dH"%len(codes),*codes)
open(d+"/seed-2x40-wide","wb").write(bytes([1,19])+struct.pack("<H",n)+book+blob)
# a book of runs up to 15 zero pairs (the packed table's kernel), 1 row of k=64:
# two 30-weight codes, then two (+1, +1) pairs (the window of a 30-weight code
# reaches weights the next code covers, where x is not 0)
book=b"".join(struct.pack("<HB",0,s) for s in range(9)) + struct.pack("<HB",4+1,4)
book+=b"".join(struct.pack("<HB",9+j,4) for j in range(1,14))  # entry 9+j: j+2 zero pairs
n=len(book)//3
codes=[22,22,8,8]
blob=struct.pack("<II",0,len(codes)) + struct.pack("<H",0x3c00) + struct.pack("<%dH"%len(codes),*codes)
open(d+"/seed-1x64-packed","wb").write(bytes([0,31])+struct.pack("<H",n)+book+blob)
PY
run_fuzzer fuzz_tq "$corpus_tq" "$secs_tq" 65536

# fuzz_model: seeds are tiny models of every architecture (mole synth, random
# weights, a made-up SentencePiece vocabulary) and a tiny GPT-2 BPE vocabulary
MOLE=${MOLE:-build/mole}
[ -x "$MOLE" ] || { echo "fuzz: $MOLE is needed for fuzz_model's seeds (build it first: make build)" >&2; exit 1; }
secs_model=${FUZZ_MODEL_SECONDS:-30}
corpus_model=$build/corpus-model
mkdir -p "$corpus_model"
for a in mixtral llama qwen3moe olmoe qwen2moe; do
  [ -f "$corpus_model/seed-$a.gguf" ] ||
    "$MOLE" synth --arch "$a" --embd 32 --layers 1 --heads 2 --heads-kv 1 --experts 2 --used 1 --ff 32 --vocab 260 \
      --ctx 64 --type q8_0 -o "$corpus_model/seed-$a.gguf" >>"$log" 2>&1
done
# three layers of 4 experts, 2 per token: the offloaded run's predictor looks ahead
[ -f "$corpus_model/seed-mixtral-l3.gguf" ] ||
  "$MOLE" synth --arch mixtral --embd 32 --layers 3 --heads 2 --heads-kv 1 --experts 4 --used 2 --ff 32 --vocab 260 \
    --ctx 64 --type q8_0 -o "$corpus_model/seed-mixtral-l3.gguf" >>"$log" 2>&1
[ -f "$corpus_model/seed-olmoe-f16.gguf" ] ||
  "$MOLE" synth --arch olmoe --embd 32 --layers 1 --heads 2 --experts 2 --used 1 --ff 32 --vocab 260 --ctx 64 \
    --type f16 -o "$corpus_model/seed-olmoe-f16.gguf" >>"$log" 2>&1
python3 - "$corpus_model/seed-bpe.gguf" <<'PY'
import struct, sys
def s(x): b = x.encode("utf-8"); return struct.pack("<Q", len(b)) + b
def kv_str(k, v): return s(k) + struct.pack("<I", 8) + s(v)
def kv_u32(k, v): return s(k) + struct.pack("<II", 4, v)
def kv_strs(k, vs): return s(k) + struct.pack("<IIQ", 9, 8, len(vs)) + b"".join(s(v) for v in vs)
def kv_i32s(k, vs): return s(k) + struct.pack("<IIQ", 9, 5, len(vs)) + b"".join(struct.pack("<i", v) for v in vs)
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))  # GPT-2's byte map
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
ch = dict(zip(bs, cs))
merges = ["\u0120 t", "h e", "\u0120t he", "l l", "e ll", "h ell", "hell o", "\u0120 w", "o r", "\u0120w or", "l d", "1 2"]
toks = [chr(ch[b]) for b in range(256)] + [m.replace(" ", "") for m in merges] + ["<|endoftext|>", "<s>", "</s>"]
kvs = [kv_str("general.architecture", "llama"), kv_str("tokenizer.ggml.model", "gpt2"),
       kv_str("tokenizer.ggml.pre", "gpt-2"), kv_strs("tokenizer.ggml.tokens", toks),
       kv_i32s("tokenizer.ggml.token_type", [1] * (len(toks) - 3) + [3] * 3), kv_strs("tokenizer.ggml.merges", merges),
       kv_u32("tokenizer.ggml.bos_token_id", len(toks) - 2), kv_u32("tokenizer.ggml.eos_token_id", len(toks) - 1)]
open(sys.argv[1], "wb").write(b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs))
PY
run_fuzzer fuzz_model "$corpus_model" "$secs_model" 262144
