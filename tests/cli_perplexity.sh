#!/usr/bin/env bash
# mole perplexity: llama-perplexity's chunking (floor(n_tokens / -c) chunks,
# --chunks N), a finite final estimate, the same numbers whatever -b, the
# shared model flags, and clear errors for bad input.
set -uo pipefail
M=${MOLE_BIN:?}
D=${MOLE_SOURCE_DIR:?}/tests/data/conformance
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
source "$(dirname "$0")/lib.sh"  # fails, fail, check
final() { sed -n 's/^Final estimate: PPL = \([0-9.]*\) +\/- \([0-9.]*\)$/\1/p' <<<"$1"; }
n_chunks() { grep -o '\[[0-9]*\][0-9.]*,' <<<"$1" | wc -l; }
same4() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a > 0 && d <= 1e-4 * a) }'; }

# a text of some thousand tokens; no trailing newline, so `mole tokenize` counts
# exactly what perplexity scores (llama-perplexity drops one trailing '\n')
for i in $(seq 1 40); do
  printf 'Line %d: the quick brown fox jumps over the lazy dog, while %d cats watch from the old stone wall.\n' \
    "$i" $((i * 7 % 13))
done | head -c -1 >"$T/text.txt"
head -c 300 "$T/text.txt" >"$T/short.txt"

for model in mixtral qwen3moe; do  # SPM with BOS; GPT-2 BPE without
  mf=$D/models/$model.gguf
  ntok=$("$M" tokenize -m "$mf" - <"$T/text.txt" 2>/dev/null | wc -w)
  [ "$ntok" -ge 1024 ] || { fail "$model: the text has only $ntok tokens"; continue; }
  out=$("$M" perplexity -m "$mf" -f "$T/text.txt" -c 128 -t 2 2>"$T/err")
  rc=$?
  p128=$(final "$out")
  if [ $rc -ne 0 ] || [ -z "$p128" ]; then
    fail "$model -c 128: rc=$rc, no final estimate: $out $(head -3 "$T/err")"
    continue
  fi
  awk -v p="$p128" 'BEGIN { exit !(p > 1 && p < 1e6) }' || fail "$model: PPL '$p128' is not finite and > 1"
  [ "$(n_chunks "$out")" = $((ntok / 128)) ] || fail "$model -c 128: $(n_chunks "$out") chunks, want $((ntok / 128)) ($ntok tokens)"
  grep -q "chunk $((ntok / 128))/$((ntok / 128))" "$T/err" || fail "$model: no progress on stderr: $(head -3 "$T/err")"
  # the last running estimate is the final one
  last=$(grep -o '\[[0-9]*\][0-9.]*,' <<<"$out" | tail -1 | sed 's/.*\]\(.*\),/\1/')
  [ "$last" = "$p128" ] || fail "$model: last running estimate $last != final $p128"
  # -c changes the chunk count; --chunks limits it
  out=$("$M" perplexity -m "$mf" -f "$T/text.txt" -c 256 -t 2 2>/dev/null)
  [ "$(n_chunks "$out")" = $((ntok / 256)) ] || fail "$model -c 256: $(n_chunks "$out") chunks, want $((ntok / 256))"
  [ -n "$(final "$out")" ] || fail "$model -c 256: no final estimate"
  out=$("$M" perplexity -m "$mf" -f "$T/text.txt" -c 128 --chunks 3 -t 2 2>/dev/null)
  [ "$(n_chunks "$out")" = 3 ] || fail "$model --chunks 3: $(n_chunks "$out") chunks"
  out2=$("$M" perplexity -m "$mf" -f "$T/text.txt" -c 128 --chunks 1000 -t 2 2>/dev/null)
  [ "$(n_chunks "$out2")" = $((ntok / 128)) ] || fail "$model --chunks 1000: $(n_chunks "$out2") chunks"
  # -b smaller than -c (also not dividing it), or larger: the same numbers (on the
  # first 4 chunks; one token per pass on 2 of them, on one model: that is slow)
  p4=$(final "$("$M" perplexity -m "$mf" -f "$T/text.txt" -c 128 --chunks 4 -t 2 2>/dev/null)")
  for b in 32 50 4096; do
    p=$(final "$("$M" perplexity -m "$mf" -f "$T/text.txt" -c 128 --chunks 4 -b $b -t 2 2>/dev/null)")
    same4 "$p" "$p4" || fail "$model -b $b: PPL '$p' != '$p4' (-b 128)"
  done
  if [ $model = mixtral ]; then
    p=$(final "$("$M" perplexity -m "$mf" -f "$T/text.txt" -c 128 --chunks 2 -b 1 -t 2 2>/dev/null)")
    p2=$(final "$("$M" perplexity -m "$mf" -f "$T/text.txt" -c 128 --chunks 2 -t 2 2>/dev/null)")
    same4 "$p" "$p2" || fail "$model -b 1: PPL '$p' != '$p2' (-b 128)"
  fi
  # the shared model flags apply: an f32 KV cache (close), offloaded experts at
  # T1 = T2 = 1 (the resident numbers), the scalar kernels (close)
  p=$(final "$("$M" perplexity -m "$mf" -f "$T/text.txt" -c 128 --chunks 4 --kv-type f32 -t 1 2>/dev/null)")
  awk -v a="$p" -v b="$p4" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b > 0 && d <= 1e-2 * b) }' ||
    fail "$model --kv-type f32: PPL '$p' far from '$p4'"
  p=$(final "$("$M" perplexity -m "$mf" -f "$T/text.txt" -c 128 --chunks 4 --expert-budget 50% -t 2 2>/dev/null)")
  same4 "$p" "$p4" || fail "$model --expert-budget 50%: PPL '$p' != '$p4'"
  p=$(final "$(MOLE_ISA=scalar "$M" perplexity -m "$mf" -f "$T/text.txt" -c 128 --chunks 4 -t 2 2>/dev/null)")
  awk -v a="$p" -v b="$p4" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(b > 0 && d <= 1e-2 * b) }' ||
    fail "$model MOLE_ISA=scalar: PPL '$p' far from '$p4'"
done

# errors: clear messages naming the flag or file, no crash
mf=$D/models/mixtral.gguf
check help 0 "usage: mole perplexity" -- "$M" perplexity --help
check listed 0 "perplexity" -- "$M" --help
check no-model 2 "-m FILE is required" -- "$M" perplexity -f "$T/text.txt"
check no-file 2 "-f TEXT is required" -- "$M" perplexity -m "$mf"
check missing-file 1 "cannot open '$T/nope.txt'" -- "$M" perplexity -m "$mf" -f "$T/nope.txt"
check dir-file 1 "cannot read '$T'" -- "$M" perplexity -m "$mf" -f "$T"
check missing-model 1 "nope.gguf" -- "$M" perplexity -m "$T/nope.gguf" -f "$T/text.txt"
ns=$("$M" tokenize -m "$mf" - <"$T/short.txt" 2>/dev/null | wc -w)
check too-few 1 "tokenizes to only $ns tokens; a context of 128 (-c) needs at least 256" -- \
  "$M" perplexity -m "$mf" -f "$T/short.txt" -c 128
check too-few-default 1 "needs at least 1024" -- "$M" perplexity -m "$mf" -f "$T/short.txt"
: >"$T/empty.txt"
check empty 1 "tokenizes to only 1 tokens" -- "$M" perplexity -m "$mf" -f "$T/empty.txt" -c 128
check ctx-small 2 "-c: 2 is too small" -- "$M" perplexity -m "$mf" -f "$T/text.txt" -c 2
check ctx-nan 2 "-c: 'abc' is not an integer" -- "$M" perplexity -m "$mf" -f "$T/text.txt" -c abc
check ctx-neg 2 "-c: -5 is out of range" -- "$M" perplexity -m "$mf" -f "$T/text.txt" -c -5
check ctx-train 1 "needs at least 2048" -- "$M" perplexity -m "$mf" -f "$T/short.txt" -c 0
check batch-neg 2 "-b: -1 is out of range" -- "$M" perplexity -m "$mf" -f "$T/text.txt" -b -1
check batch-nan 2 "-b: '1x' is not an integer" -- "$M" perplexity -m "$mf" -f "$T/text.txt" -b 1x
check chunks-zero 2 "--chunks: 0 chunks" -- "$M" perplexity -m "$mf" -f "$T/text.txt" --chunks 0
check bad-flag 2 "unknown flag '--bogus'" -- "$M" perplexity -m "$mf" -f "$T/text.txt" --bogus
check no-value 2 "flag -f needs a value" -- "$M" perplexity -m "$mf" -f
check kv-type 2 "--kv-type: 'f8'" -- "$M" perplexity -m "$mf" -f "$T/text.txt" --kv-type f8

# --ref: against itself KL 0 and top-1 100% at every scored position; its
# experts re-quantized to Q4_0 (mole pack) against it, a small positive KL
check ref-self 0 "KL divergence vs $mf: 0.000000 +/- 0.000000, top-1 agreement 100.0000% over 189 positions" -- \
  "$M" perplexity -m "$mf" -f "$T/text.txt" -c 128 --chunks 3 --ref "$mf"
"$M" pack "$D/models/mixtral.gguf" -o "$T/q4.gguf" --high q4_0 >/dev/null 2>&1 || fail "pack q4_0"
out=$("$M" perplexity -m "$T/q4.gguf" -f "$T/text.txt" -c 128 --chunks 3 --ref "$D/models/mixtral.gguf" 2>/dev/null)
kl=$(sed -n 's/^KL divergence vs .*: \([0-9.]*\) +\/- .*/\1/p' <<<"$out")
awk -v k="${kl:-0}" 'BEGIN { exit !(k > 0 && k < 0.1) }' || fail "ref-q4_0: KL '$kl' (want a small positive value)"

if [ $fails -ne 0 ]; then
  echo "cli_perplexity: $fails failed"
  exit 1
fi
echo "cli_perplexity: all passed"
