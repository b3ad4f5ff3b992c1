#!/usr/bin/env bash
# Expert offloading from the CLI: the offload flags on every model command
# with errors naming the flag; mole pack; tiered logits equal to the resident
# ones (io_uring and pread, plain and packed); --stats; the routing trace and
# mole cachesim.
set -uo pipefail
M=${MOLE_BIN:?}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
source "$(dirname "$0")/lib.sh"  # fails, fail, check
same() {  # same NAME A B
  cmp -s "$2" "$3" || { echo "FAIL $1: $2 and $3 differ"; fails=$((fails + 1)); }
}
failed() { echo "FAIL $1: the command failed"; fails=$((fails + 1)); }  # for: cmd && same NAME A B || failed NAME

"$M" synth --arch mixtral --embd 256 --layers 4 --experts 8 --used 2 --ff 512 --type q8_0 --vocab 1000 --ctx 256 \
  -o "$T/m.gguf" >/dev/null 2>&1 || { echo "FAIL synth"; exit 1; }
TOK=5,17,300,42,999,7,123,64,1,2,3,4
L=(logits -m "$T/m.gguf" --tokens $TOK --kv-type f32)

# flag errors name the flag, on every command that runs a model
for c in run chat logits bench; do
  check "$c-budget" 2 "--expert-budget: 'lots' is not a size" -- "$M" $c -m "$T/m.gguf" --expert-budget lots
  check "$c-policy" 2 "--cache-policy: 'mru'" -- "$M" $c -m "$T/m.gguf" --cache-policy mru
  check "$c-weights" 2 "--cache-weights: '0.5,0.5,0.5,0' sums to 1.5" -- "$M" $c -m "$T/m.gguf" --cache-weights 0.5,0.5,0.5,0
  check "$c-weights-n" 2 "--cache-weights: '1,0'" -- "$M" $c -m "$T/m.gguf" --cache-weights 1,0
  check "$c-io" 2 "--io: 'aio'" -- "$M" $c -m "$T/m.gguf" --io aio
  check "$c-t1" 2 "--t1: 2 is out of range" -- "$M" $c -m "$T/m.gguf" --t1 2
  check "$c-depth" 2 "--prefetch-depth: 9 is out of range" -- "$M" $c -m "$T/m.gguf" --prefetch-depth 9
  check "$c-help" 0 "--expert-budget" -- "$M" $c --help
done
check pct-range 2 "percentage must be in (0, 100]" -- "$M" run -m "$T/m.gguf" --expert-budget 150%
check too-small 1 "is too small" -- "$M" "${L[@]}" -o "$T/x.f32" --expert-budget 100KiB
check weights-not-hobbit 1 "hobbit policy only" -- "$M" "${L[@]}" -o "$T/x.f32" --cache-policy lru --cache-weights 0.25,0.25,0.25,0.25

# tiered logits equal the resident ones
"$M" "${L[@]}" -o "$T/ref.f32" --expert-budget 0 || fails=$((fails + 1))
# a prompt routed to more experts than the budget holds runs in waves
for io in uring pread; do
  "$M" "${L[@]}" -o "$T/w.f32" --expert-budget 1MiB --io $io && same "prefill-waves-$io" "$T/ref.f32" "$T/w.f32" || failed "prefill-waves-$io"
done
for io in uring pread; do
  "$M" "${L[@]}" -o "$T/a.f32" --expert-budget 3.5MiB --io $io && same "tiered-$io" "$T/ref.f32" "$T/a.f32" || failed "tiered-$io"
  "$M" "${L[@]}" -o "$T/b.f32" --expert-budget 1MiB --io $io --one-by-one --prefetch-depth 2 &&
    same "tiny-$io-1by1" "$T/ref.f32" "$T/b.f32" || failed "tiny-$io-1by1"
done
"$M" "${L[@]}" -o "$T/c.f32" --expert-budget 100% --cache-policy lfu && same "budget-100%" "$T/ref.f32" "$T/c.f32" || failed "budget-100%"

# pack: high copies keep the source type (same logits), low copies q4_0
check pack 0 "" -- "$M" pack "$T/m.gguf" -o "$T/p.gguf" --low q4_0
check pack-inspect 0 "mole.pack.low.types" -- "$M" inspect "$T/p.gguf"
P=(logits -m "$T/p.gguf" --tokens $TOK --kv-type f32)
"$M" "${P[@]}" -o "$T/p0.f32" && same packed-resident "$T/ref.f32" "$T/p0.f32" || failed packed-resident
"$M" "${P[@]}" -o "$T/p1.f32" --expert-budget 1MiB --one-by-one --io pread && same packed-tiny "$T/ref.f32" "$T/p1.f32" || failed packed-tiny
"$M" "${P[@]}" -o "$T/p2.f32" --t1 0 --t2 1 || fails=$((fails + 1))
cmp -s "$T/ref.f32" "$T/p2.f32" && { echo "FAIL mixed precision changed nothing"; fails=$((fails + 1)); }
check pack-again 1 "already a packed expert store" -- "$M" pack "$T/p.gguf" -o "$T/q.gguf"
check pack-bad-type 2 "--high: 'q3_q'" -- "$M" pack "$T/m.gguf" -o "$T/q.gguf" --high q3_q
check pack-over-in 2 "-o $T/./m.gguf and the input $T/m.gguf are the same file" -- "$M" pack "$T/m.gguf" -o "$T/./m.gguf"
check pack-over-low 2 "-o $T/./p.gguf and --low $T/p.gguf are the same file" -- "$M" pack "$T/m.gguf" -o "$T/./p.gguf" --low "$T/p.gguf"
check pack-no-out 2 "-o FILE is required" -- "$M" pack "$T/m.gguf"
check pack-dense 1 "missing tensor 'blk.0.ffn_gate_exps.weight'" -- "$M" pack "${MOLE_SOURCE_DIR:?}/tests/data/conformance/models/llama-dense.gguf" -o "$T/q.gguf"
check pack-requant 0 "" -- "$M" pack "$T/m.gguf" -o "$T/q.gguf" --high q6_k --low q4_k
check packed-q6k-run 0 "experts: tiered" -- "$M" run -m "$T/q.gguf" --tokens 1,2,3 -n 8 --ids --expert-budget 2MiB -b 1 --t1 0.2 --t2 0.9 --stats
# --low FILE: the same model in another type (as llama-quantize would make it) gives its experts as
# they are: synth quantizes the same f32 weights, so the store equals --low q4_0's byte for byte
S=(synth --arch mixtral --embd 256 --layers 2 --experts 4 --used 2 --ff 512 --vocab 1000 --ctx 256 --seed 3)
"$M" "${S[@]}" --type f32 -o "$T/s32.gguf" >/dev/null 2>&1 && "$M" "${S[@]}" --type q4_0 -o "$T/s40.gguf" >/dev/null 2>&1 ||
  failed synth-low-file
check pack-low-type 0 "" -- "$M" pack "$T/s32.gguf" -o "$T/la.gguf" --low q4_0
check pack-low-file 0 "" -- "$M" pack "$T/s32.gguf" -o "$T/lb.gguf" --low "$T/s40.gguf"
same pack-low-file-bytes "$T/la.gguf" "$T/lb.gguf"
check pack-low-file-shape 1 "experts of 4 layers x 8 x [256, 512], but $T/s32.gguf has 2 layers x 4" -- \
  "$M" pack "$T/s32.gguf" -o "$T/lc.gguf" --low "$T/m.gguf"
check pack-low-file-dense 1 "missing tensor 'blk.0.ffn_gate_exps.weight'" -- "$M" pack "$T/s32.gguf" -o "$T/lc.gguf" \
  --low "${MOLE_SOURCE_DIR:?}/tests/data/conformance/models/llama-dense.gguf"

# --stats, the routing trace and cachesim
check run-stats 0 "experts: tiered, budget 2.0 MiB" -- "$M" run -m "$T/m.gguf" --tokens 1,2,3 -n 16 --ids -b 1 \
  --expert-budget 2MiB --stats --trace-routing "$T/r.trace"
check trace-header 0 "mole-trace 1 layers 4 experts 8 used 2" -- head -1 "$T/r.trace"
check trace-align 0 "low 0 align 4096" -- head -1 "$T/r.trace"
check cachesim 0 "hobbit" -- "$M" cachesim --trace "$T/r.trace" --budget 50%
check cachesim-lru 0 "lru     hit rate" -- "$M" cachesim --trace "$T/r.trace" --budget 2MiB --cache-policy lru --prefetch
check cachesim-json 0 '"policy": "hobbit"' -- "$M" cachesim --trace "$T/r.trace" --budget 50% --cache-policy hobbit \
  --cache-weights 0.25,0.25,0.25,0.25 --json
check cachesim-small 1 "a token needs 2" -- "$M" cachesim --trace "$T/r.trace" --budget 100KiB
# a prompt in one batch with a budget below a layer's experts: replayed in waves, as it ran
check run-waves-trace 0 "experts: tiered" -- "$M" run -m "$T/m.gguf" --tokens $TOK -n 4 --ids --expert-budget 2MiB \
  --stats --trace-routing "$T/w.trace"
check cachesim-waves 0 "hobbit" -- "$M" cachesim --trace "$T/w.trace" --budget 2MiB --cache-policy hobbit
# hostile traces: counts that would overflow the cache's int64 tallies are errors naming the line
H=$(head -1 "$T/r.trace")
printf '%s\ns 0 2\nL 0 1:h:9223372036854775807 skip 0\n' "$H" > "$T/bad1.trace"
printf '%s\ns 0 99999999999\n' "$H" > "$T/bad2.trace"
printf '%s\ns 0 2\nL 0 1:h:2 skip -1\n' "$H" > "$T/bad3.trace"
printf '%s\ns 0 2\nL 0 1:h:2 skip 9223372036854775807\n' "$H" > "$T/bad4.trace"
sed 's/slot_high [0-9]*/slot_high 9223372036854775807/' "$T/r.trace" > "$T/bad5.trace"
printf '%s\ns 0 2\nL 0 1:h:1 3:l:1 1:h:1 skip 0\n' "$H" > "$T/bad6.trace"
sed 's/align [0-9]*/align 0/' "$T/r.trace" > "$T/bad7.trace"
check trace-expert-tokens 1 "bad1.trace: line 3: an expert with more tokens than its step has" -- "$M" cachesim --trace "$T/bad1.trace" --budget 50%
check trace-step-tokens 1 "bad2.trace: line 2: more tokens in a step" -- "$M" cachesim --trace "$T/bad2.trace" --budget 50%
check trace-skip-neg 1 "bad3.trace: line 3: bad skip count" -- "$M" cachesim --trace "$T/bad3.trace" --budget 50%
check trace-skip-big 1 "bad4.trace: line 3: bad skip count" -- "$M" cachesim --trace "$T/bad4.trace" --budget 50% --cache-policy all
check trace-slot-bytes 1 "bad5.trace: line 1: header values out of range" -- "$M" cachesim --trace "$T/bad5.trace" --budget 50%
check trace-twice 1 "bad6.trace: line 3: an expert twice in one precision" -- "$M" cachesim --trace "$T/bad6.trace" --budget 50%
check trace-align-0 1 "bad7.trace: line 1: header values out of range" -- "$M" cachesim --trace "$T/bad7.trace" --budget 50%
check cachesim-no-trace 2 "--trace FILE is required" -- "$M" cachesim --budget 1GiB
check bench-offload 0 "tg" -- "$M" bench -m "$T/m.gguf" -p 8 -n 8 -r 1 --expert-budget 4MiB

if [ $fails -ne 0 ]; then
  echo "cli_offload: $fails failed"
  exit 1
fi
echo "cli_offload: ok"
