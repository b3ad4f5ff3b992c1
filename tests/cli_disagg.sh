#!/usr/bin/env bash
# Attention and experts on separate MPI processes (--disagg, MegaScale-Infer)
# under mpirun --oversubscribe: several sequences decoded together (mole
# logits --seqs, the server's batcher) give the single process's logits bit
# for bit (f32 and f16 KV), for every MoE architecture and a quantized
# model, disaggregated (A attention + E expert ranks) and co-located, with
# ping-pong micro-batches and without; expert ranks with offloaded experts;
# mole serve under mpirun answers seeded requests with the single process's
# texts; and a bad setup gets an error that says what is wrong.
set -euo pipefail
MOLE=${MOLE_BIN:?}
SRC=${MOLE_SOURCE_DIR:?}
T=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2> /dev/null || true; done
  rm -rf "$T"
}
trap cleanup EXIT
# stop_mpirun (its fail() is replaced by this script's own below)
# shellcheck source=tests/lib.sh
. "$SRC/tests/lib.sh"
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
command -v mpirun > /dev/null || fail "mpirun not found (openmpi-bin)"
MPI=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --bind-to none)
if [ "${MOLE_ASAN:-0}" = 1 ]; then  # Open MPI's own allocations read as leaks (see cli_dist.sh)
  MPI+=(-x "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0")
fi
M=$SRC/tests/data/conformance/models
TOK=$(seq -s, 1 3 70)  # 24 tokens

same() {  # model np kv label args...
  local model=$1 np=$2 kv=$3 label=$4
  shift 4
  "${MPI[@]}" -np "$np" "$MOLE" logits -m "$M/$model.gguf" --tokens "$TOK" --seqs 5 -o "$T/out.f32" --kv-type "$kv" \
    -t 1 "$@" > "$T/mpi.log" 2>&1 || { cat "$T/mpi.log" >&2; fail "$model $label: mpirun failed"; }
  cmp -s "$T/ref-$model-$kv.f32" "$T/out.f32" || fail "$model $label ($kv KV): logits differ from the single process"
  echo "$(printf '%-16s %-4s' "$model" "$kv") $label: equal"
}

for model in mixtral qwen2moe qwen3moe olmoe mixtral-q4_k_m; do
  for kv in f32 f16; do
    "$MOLE" logits -m "$M/$model.gguf" --tokens "$TOK" --seqs 5 -o "$T/ref-$model-$kv.f32" --kv-type "$kv" -t 1 \
      > /dev/null 2>&1 || fail "$model: single process"
  done
  same "$model" 3 f32 "attn=2,expert=1 ping-pong m=2" --disagg attn=2,expert=1 --micro-batches 2
  same "$model" 3 f16 "attn=1,expert=2 ping-pong m=3" --disagg attn=1,expert=2 --micro-batches 3
done
same mixtral 4 f32 "attn=2,expert=2 no ping-pong m=2" --disagg attn=2,expert=2 --micro-batches 2 --no-ping-pong
same mixtral 4 f32 "attn=2,expert=2 m=1" --disagg attn=2,expert=2 --micro-batches 1
same mixtral 3 f32 "co-located x3 ping-pong m=2" --disagg colocated --micro-batches 2
same qwen2moe 2 f32 "co-located x2 no ping-pong m=4" --disagg colocated --micro-batches 4 --no-ping-pong
same mixtral 3 f32 "attn=1,expert=2 experts offloaded (10%)" --disagg attn=1,expert=2 --expert-budget 10%
# one sequence, one token at a time (mole logits --one-by-one)
"$MOLE" logits -m "$M/olmoe.gguf" --tokens "$TOK" --one-by-one -o "$T/ref1.f32" --kv-type f32 -t 1 > /dev/null 2>&1
"${MPI[@]}" -np 3 "$MOLE" logits -m "$M/olmoe.gguf" --tokens "$TOK" --one-by-one -o "$T/out1.f32" --kv-type f32 -t 1 \
  --disagg attn=1,expert=2 > "$T/mpi.log" 2>&1 || { cat "$T/mpi.log" >&2; fail "one by one"; }
cmp -s "$T/ref1.f32" "$T/out1.f32" || fail "olmoe one by one: logits differ"
echo "olmoe one token per pass: equal"

# bad setups: the error names the problem
bad() {  # np pattern args...
  local np=$1 pat=$2
  shift 2
  if "${MPI[@]}" -np "$np" "$MOLE" logits --tokens 1,2 -o "$T/bad.f32" -t 1 "$@" > "$T/bad.log" 2>&1; then
    fail "accepted: $*"
  fi
  grep -q -- "$pat" "$T/bad.log" || { cat "$T/bad.log" >&2; fail "no '$pat' for: $*"; }
}
bad 3 "needs attn + expert = 3" -m "$M/mixtral.gguf" --disagg attn=1,expert=1
bad 2 "a dense model" -m "$M/llama-dense.gguf" --disagg colocated
bad 2 "is not attn=A,expert=E" -m "$M/mixtral.gguf" --disagg attn=x
bad 2 "kv budget" -m "$M/mixtral.gguf" --disagg colocated --kv-budget 64
bad 2 "not with --parallel" -m "$M/mixtral.gguf" --disagg colocated --parallel hmp
bad 2 "out of range" -m "$M/mixtral.gguf" --disagg colocated --micro-batches 17
"$MOLE" logits -m "$M/mixtral.gguf" --tokens 1,2 -o "$T/bad.f32" --micro-batches 2 > "$T/bad.log" 2>&1 &&
  fail "--micro-batches without --disagg accepted"
grep -q "go with --disagg" "$T/bad.log" || fail "--micro-batches without --disagg: no error"
"$MOLE" logits -m "$M/mixtral.gguf" --tokens 1,2 -o "$T/bad.f32" --disagg colocated > "$T/bad.log" 2>&1 &&
  fail "--disagg without mpirun accepted"
grep -q "under mpirun" "$T/bad.log" || fail "--disagg without mpirun: no error"
echo "bad setups: refused with errors"

# mole serve: the same seeded requests, four at once, single process and disaggregated
"$MOLE" synth --arch qwen3moe --embd 64 --layers 2 --experts 8 --used 2 --ff 64 --ctx 1024 --type q8_0 \
  --vocab-from "$SRC/tests/data/conformance/tokenizer/ggml-vocab-llama-spm.gguf" --seed 4 -o "$T/s.gguf" > /dev/null
serve_texts() {  # out np (0: no mpirun) flags...
  local out=$1 np=$2
  shift 2
  local pre=("$MOLE")
  [ "$np" = 0 ] || pre=("${MPI[@]}" -np "$np" "$MOLE")
  "${pre[@]}" serve -m "$T/s.gguf" -t 1 --port 0 --parallel 4 --kv-type f32 --template chatml "$@" 2> "$T/serve.log" &
  local pid=$!
  PIDS+=("$pid")
  local port=
  for _ in $(seq 600); do
    port=$(sed -n 's/.*listening on http:\/\/[^:]*:\([0-9]*\).*/\1/p' "$T/serve.log")
    [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" > /dev/null && break
    sleep 0.1
  done
  [ -n "$port" ] || { cat "$T/serve.log" >&2; fail "server did not start: $*"; }
  local cp=()
  for i in 1 2 3 4; do
    curl -sf "http://127.0.0.1:$port/v1/completions" \
      -d "{\"prompt\":\"Request number $i says\",\"max_tokens\":$((8 + 4 * i)),\"seed\":$i,\"temperature\":0.8}" \
      > "$T/r$i.json" &
    cp+=($!)
  done
  for c in "${cp[@]}"; do wait "$c" || true; done
  for i in 1 2 3 4; do
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"])' "$T/r$i.json" ||
      fail "request $i: $(cat "$T/r$i.json")"
  done > "$out"
  if [ "$np" = 0 ]; then
    kill -TERM "$pid"
    wait "$pid" 2> /dev/null || true
  else
    stop_mpirun "$pid" TERM
  fi
}
serve_texts "$T/one.txt" 0
serve_texts "$T/dis.txt" 3 --disagg attn=2,expert=1 --micro-batches 2
cmp -s "$T/one.txt" "$T/dis.txt" || { diff "$T/one.txt" "$T/dis.txt" >&2; fail "serve: texts differ"; }
echo "serve: the same texts disaggregated"
echo "cli_disagg: ok"
