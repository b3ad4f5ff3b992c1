#!/usr/bin/env bash
# mole train-retain (Locret's retaining heads) from the CLI: flag errors name
# the flag; missing model, data or output; too little text says how many
# tokens it found and needs; a tiny run writes heads that mole inspect reads,
# the report, the curve and (with gnuplot) the plot; the same seed gives the
# same bytes.
set -uo pipefail
M=${MOLE_BIN:?}
S=${MOLE_SOURCE_DIR:?}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
source "$(dirname "$0")/lib.sh"  # fails, fail, check

"$M" synth --arch mixtral --embd 64 --layers 2 --heads 4 --heads-kv 2 --experts 4 --used 2 --ff 64 --type f16 \
  --vocab 300 --ctx 128 -o "$T/m.gguf" >/dev/null 2>&1 || { echo "FAIL synth"; exit 1; }
D=$S/README.md
R=(train-retain -m "$T/m.gguf" --data "$D" --tokens 640 --seq-len 64 --window 8 --hidden 16 --batch 64 --epochs 3 -t 2)

check help 0 "--window W" -- "$M" train-retain --help
check listed 0 "train-retain" -- "$M" --help
check no-model 2 "-m MODEL is required" -- "$M" train-retain --data "$D" -o "$T/h.gguf"
check no-data 2 "--data TEXT is required" -- "$M" train-retain -m "$T/m.gguf" -o "$T/h.gguf"
check no-out 2 "-o FILE is required" -- "$M" train-retain -m "$T/m.gguf" --data "$D"
check same-file 2 "-o $T/m.gguf and -m $T/m.gguf are the same file" -- "$M" train-retain -m "$T/m.gguf" --data "$D" -o "$T/m.gguf"
cp "$D" "$T/d.txt" && sum0=$(cat "$T/m.gguf" "$T/d.txt" | md5sum)
check same-file-dot 2 "-o $T/./m.gguf and -m $T/m.gguf are the same file" -- "$M" train-retain -m "$T/m.gguf" --data "$D" -o "$T/./m.gguf"
check csv-over-data 2 "--csv $T/d.txt and --data $T/d.txt are the same file" -- "$M" "${R[@]/$D/$T/d.txt}" -o "$T/h.gguf" --csv "$T/d.txt"
check report-over-model 2 "--report $T/m.gguf and -m $T/m.gguf" -- "$M" "${R[@]}" -o "$T/h.gguf" --report "$T/m.gguf"
[ "$(cat "$T/m.gguf" "$T/d.txt" | md5sum)" = "$sum0" ] || { echo "FAIL a refused output changed an input"; fails=$((fails + 1)); }
check bad-flag 2 "unknown flag '--layers'" -- "$M" "${R[@]}" -o "$T/h.gguf" --layers 3
check stray-arg 2 "unexpected argument 'extra'" -- "$M" "${R[@]}" -o "$T/h.gguf" extra
check bad-window 2 "--window: 0 is out of range" -- "$M" "${R[@]}" -o "$T/h.gguf" --window 0
check bad-hidden 2 "--hidden: 'many' is not an integer" -- "$M" "${R[@]}" -o "$T/h.gguf" --hidden many
check bad-heldout 2 "--heldout: 1 is out of range" -- "$M" "${R[@]}" -o "$T/h.gguf" --heldout 1
check bad-lr 2 "--lr: -1 is out of range" -- "$M" "${R[@]}" -o "$T/h.gguf" --lr -1
check bad-smooth 2 "--smooth" -- "$M" "${R[@]}" -o "$T/h.gguf" --smooth -0.5
check bad-batch 2 "--batch: 0 is out of range" -- "$M" "${R[@]}" -o "$T/h.gguf" --batch 0
check bad-epochs 2 "--epochs: -2 is out of range" -- "$M" "${R[@]}" -o "$T/h.gguf" --epochs -2
check bad-tokens 2 "--tokens: 2 is out of range" -- "$M" "${R[@]}" -o "$T/h.gguf" --tokens 2
check bad-seq-len 2 "--seq-len" -- "$M" "${R[@]}" -o "$T/h.gguf" --seq-len 1
check bad-max-mem 2 "--max-mem" -- "$M" "${R[@]}" -o "$T/h.gguf" --max-mem 0
check no-value 2 "flag --seed needs a value" -- "$M" "${R[@]}" -o "$T/h.gguf" --seed
check missing-data 1 "cannot open '$T/nope.txt'" -- "$M" train-retain -m "$T/m.gguf" --data "$T/nope.txt" -o "$T/h.gguf"
check missing-model 1 "$T/nope.gguf" -- "$M" train-retain -m "$T/nope.gguf" --data "$D" -o "$T/h.gguf"
check window-too-big 1 "--window 63: must be below" -- "$M" "${R[@]}" -o "$T/h.gguf" --window 63
check too-few-tokens 1 "--tokens 64: need at least two sequences" -- "$M" "${R[@]}" -o "$T/h.gguf" --tokens 64
check max-mem 1 "over --max-mem" -- "$M" "${R[@]}" -o "$T/h.gguf" --max-mem 0.0001
echo "a few words" >"$T/short.txt"
check short-text 1 "tokens; train-retain needs at least 126" -- "$M" train-retain -m "$T/m.gguf" --data "$T/short.txt" \
  -o "$T/h.gguf" --seq-len 64 --window 8
[ -e "$T/h.gguf" ] && fail "a failed run left $T/h.gguf"

check train 0 "top-10% overlap" -- "$M" "${R[@]}" -o "$T/h.gguf" --csv "$T/c.csv" --report "$T/r.json" --png "$T/c.png"
check inspect 0 "mole-retain" -- "$M" inspect "$T/h.gguf"
check inspect-tensor 0 "retain.1.w2" -- "$M" inspect "$T/h.gguf"
[ "$(head -1 "$T/c.csv")" = "epoch,train_loss,heldout_loss,heldout_smoothl1" ] && [ "$(wc -l <"$T/c.csv")" = 5 ] || fail "csv: $(cat "$T/c.csv")"
python3 - "$T/r.json" <<'PY' || fail "report json"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["n_layer"] == 2 and r["window"] == 8 and r["epochs"] == 3, r
assert r["heldout_loss_final"]["mean"] < r["heldout_loss_init"]["mean"], r
assert set(r["overlap"]) >= {"streaming", "h2o", "locret", "random", "top_k", "n_keys"}, r
PY
if command -v gnuplot >/dev/null; then
  [ -s "$T/c.png" ] || fail "no plot from gnuplot"
fi
# without gnuplot: a warning, the heads still written
check no-gnuplot 0 "gnuplot is not installed" -- env PATH=/nonexistent "$M" "${R[@]}" -o "$T/h2.gguf" --png "$T/c2.png"
[ -s "$T/h2.gguf" ] || fail "no heads without gnuplot"
# deterministic, whatever the thread count
"$M" "${R[@]}" -o "$T/h3.gguf" -t 1 >/dev/null 2>&1 && cmp -s "$T/h.gguf" "$T/h3.gguf" || fail "train-retain is not deterministic"

echo "cli_train_retain: $fails failures"
[ "$fails" = 0 ]
