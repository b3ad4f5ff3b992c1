#!/usr/bin/env bash
# Bounded KV caches from the command line: the flags of run, logits,
# perplexity, chat and bench; a budget covering the context gives the full
# cache's logits exactly; a prompt far longer than -c runs within the budget
# and --stats says so; bad settings and heads files are refused clearly.
set -uo pipefail
M=${MOLE_BIN:?}
D=${MOLE_SOURCE_DIR:?}/tests/data/conformance
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
source "$(dirname "$0")/lib.sh"  # fails, fail, check
MF=$D/models/mixtral.gguf
ids=$(seq -s, 5 4 200)  # 49 tokens

# logits: a budget >= the context reproduces the full cache bit for bit, every policy, f16 and f32
for kt in f16 f32; do
  "$M" logits -m "$MF" -t 2 -b 8 --kv-type "$kt" --tokens "$ids" -o "$T/full.f32" >/dev/null 2>&1 ||
    fail "logits full $kt"
  for p in streaming h2o; do
    "$M" logits -m "$MF" -t 2 -b 8 --kv-type "$kt" --kv-budget 64 --kv-policy "$p" --tokens "$ids" \
      -o "$T/b.f32" >/dev/null 2>&1 || fail "logits $p $kt"
    cmp -s "$T/full.f32" "$T/b.f32" || fail "logits: --kv-budget 64 --kv-policy $p ($kt) differs from the full cache"
  done
  # with the experts offloaded (a RAM budget for 40% of them) as well
  "$M" logits -m "$MF" -t 2 -b 8 --kv-type "$kt" --kv-budget 64 --expert-budget 40% --tokens "$ids" \
    -o "$T/o.f32" >/dev/null 2>&1 || fail "logits offloaded $kt"
  cmp -s "$T/full.f32" "$T/o.f32" || fail "logits: --kv-budget 64 with offloaded experts ($kt) differs from the full cache"
  # a small budget changes them
  "$M" logits -m "$MF" -t 2 -b 8 --kv-type "$kt" --kv-budget 16 --kv-recent 4 --kv-sinks 2 --tokens "$ids" \
    -o "$T/s.f32" >/dev/null 2>&1 || fail "logits budget 16 $kt"
  cmp -s "$T/full.f32" "$T/s.f32" && fail "logits: --kv-budget 16 ($kt) gives the full cache's logits"
done

# run: 400 prompt tokens + 40 generated with -c 64: the budget, not -c, bounds the cache
long=$(seq -s, 3 1 402)
out=$("$M" run -m "$MF" -t 2 -c 64 -b 32 --kv-budget 48 --kv-policy streaming --tokens "$long" -n 40 --ignore-eos \
  --ids --stats 2>&1)
rc=$?
[ $rc -eq 0 ] || fail "run with a budget: rc=$rc: $(tail -3 <<<"$out")"
grep -q "kv cache: streaming, budget 48 (recent 12, sinks 4), 48 of 80 slots in use after 439 positions" <<<"$out" ||
  fail "run --stats: no or wrong kv cache line: $(grep 'kv cache' <<<"$out")"
grep -q "gen: *40 tokens" <<<"$out" || fail "run: did not generate 40 tokens: $(grep gen <<<"$out")"
out=$("$M" run -m "$MF" -t 2 -c 64 --tokens "$long" -n 4 --ids 2>&1)
grep -q "context" <<<"$out" || fail "run without a budget: 400 tokens in -c 64 should be refused: $out"
out=$("$M" run -m "$MF" -t 2 --tokens "$ids" -n 2 --ids --stats 2>&1)
grep -q "kv cache: full, 50 of" <<<"$out" || fail "run --stats (full): $(grep 'kv cache' <<<"$out")"

# perplexity with a budget, and --ref against the model itself with a full cache
for i in $(seq 1 30); do
  printf 'Line %d: the quick brown fox jumps over the lazy dog, while %d cats watch from the old stone wall.\n' \
    "$i" $((i * 7 % 13))
done >"$T/text.txt"
out=$("$M" perplexity -m "$MF" -f "$T/text.txt" -c 128 -b 16 -t 2 --kv-budget 32 --kv-policy h2o --ref "$MF" 2>&1)
grep -q "Final estimate" <<<"$out" || fail "perplexity with a budget: $(tail -3 <<<"$out")"
grep -q "kv cache: h2o, budget 32" <<<"$out" || fail "perplexity: no kv cache line"
kl=$(sed -n 's/^KL divergence vs .*: \([0-9.]*\) +\/- .*/\1/p' <<<"$out")
awk -v k="$kl" 'BEGIN { exit !(k > 0) }' || fail "perplexity --ref: KL '$kl' of a bounded cache vs the full one should be > 0"
out=$("$M" perplexity -m "$MF" -f "$T/text.txt" -c 128 -b 16 -t 2 --kv-budget 128 --ref "$MF" 2>&1)
grep -q "KL divergence vs .*: 0.000000 +/- 0.000000, top-1 agreement 100.0000%" <<<"$out" ||
  fail "perplexity: a budget covering -c is not the full cache: $(grep KL <<<"$out")"

# chat: several turns through a cache that evicts (each turn past the first starts over when the
# kept prefix cannot be rewound)
printf 'hello there, how are you today?\nand tell me more about the weather please\nthanks\n' |
  "$M" chat -m "$MF" -t 2 --template chatml -n 12 --seed 1 --kv-budget 16 --kv-recent 4 -b 8 >"$T/chat.out" 2>&1 ||
  fail "chat with a budget: $(tail -3 "$T/chat.out")"

# bench --json reports the cache
out=$("$M" bench -m "$MF" -t 2 -p 100 -n 4 -r 1 -b 16 --kv-budget 32 --kv-policy h2o --json 2>&1)
grep -q '"kv": {"policy": "h2o", "budget": 32, "capacity": 48' <<<"$out" || fail "bench --json: $out"

# locret with heads from mole train-retain: exact at a covering budget, runs at a small one, and the
# heads fit only their model
"$M" train-retain -m "$MF" --data "$T/text.txt" --tokens 640 --seq-len 64 --window 8 --hidden 16 --batch 64 \
  --epochs 2 -t 2 -o "$T/heads.gguf" >/dev/null 2>&1 || fail "train-retain for the locret checks"
"$M" logits -m "$MF" -t 2 -b 8 --kv-type f32 --tokens "$ids" -o "$T/full.f32" >/dev/null 2>&1
"$M" logits -m "$MF" -t 2 -b 8 --kv-type f32 --kv-budget 64 --retain "$T/heads.gguf" --tokens "$ids" -o "$T/l.f32" \
  >/dev/null 2>&1 || fail "logits locret"
cmp -s "$T/full.f32" "$T/l.f32" || fail "logits: locret at a covering budget differs from the full cache"
out=$("$M" run -m "$MF" -t 2 -b 8 --kv-budget 16 --retain "$T/heads.gguf" --kv-decay 0.5 --tokens "$long" -n 8 \
  --ignore-eos --ids --stats 2>&1)
grep -q "kv cache: locret, budget 16 (recent 4, sinks 4, decay 0.5), 16 of 24 slots in use after 407 positions" \
  <<<"$out" || fail "run locret: $(grep -E 'kv cache|error' <<<"$out")"
check "heads of another model" 1 "retaining heads for another model" -- \
  "$M" run -m "$D/models/qwen3moe.gguf" --kv-budget 16 --retain "$T/heads.gguf" --tokens 1,2 -n 1

# bad settings
check "recent+sinks > budget" 1 "smaller than kv recent 30 + kv sinks 4" -- \
  "$M" run -m "$MF" --kv-budget 32 --kv-recent 30 --kv-sinks 4 --tokens 1,2 -n 1
check "bad policy" 2 "--kv-policy: 'lru' is not full, streaming, h2o or locret" -- \
  "$M" run -m "$MF" --kv-budget 32 --kv-policy lru --tokens 1,2 -n 1
check "negative budget" 2 "--kv-budget" -- "$M" run -m "$MF" --kv-budget -1 --tokens 1,2 -n 1
check "policy without budget" 1 "needs a kv budget" -- "$M" run -m "$MF" --kv-policy h2o --tokens 1,2 -n 1
check "full with budget" 1 "takes no kv budget" -- "$M" run -m "$MF" --kv-policy full --kv-budget 8 --tokens 1,2 -n 1
check "locret without heads" 1 "needs retaining heads" -- \
  "$M" run -m "$MF" --kv-policy locret --kv-budget 32 --tokens 1,2 -n 1
check "heads are a model" 1 "not a retaining-heads file" -- \
  "$M" run -m "$MF" --kv-budget 32 --retain "$MF" --tokens 1,2 -n 1
check "missing heads" 1 "$T/none.gguf" -- "$M" run -m "$MF" --kv-budget 32 --retain "$T/none.gguf" --tokens 1,2 -n 1
check "heads with streaming" 1 "locret only" -- \
  "$M" run -m "$MF" --kv-budget 32 --kv-policy streaming --retain "$T/x.gguf" --tokens 1,2 -n 1
check "bad decay" 2 "--kv-decay" -- "$M" run -m "$MF" --kv-budget 32 --kv-decay -1 --tokens 1,2 -n 1
check "serve: a budget not below -c" 1 "not below the context" -- timeout 60 "$M" serve -m "$MF" --port 0 -c 32 --kv-budget 32
check "serve: bad policy" 2 "kv-policy" -- timeout 60 "$M" serve -m "$MF" --port 0 --kv-budget 16 --kv-policy nope

[ "$fails" -eq 0 ] && echo "cli_kv: all passed"
exit $((fails > 0))
