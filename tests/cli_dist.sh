#!/usr/bin/env bash
# One model over several MPI processes (mpirun --oversubscribe on this
# machine): logits of tp and hmp, with and without overlap, equal and
# unequal shares (a plan file), N = 2, 3, 4, for every architecture and a
# quantized model, against the single process: within the conformance
# tolerances (f32 weights: relative error <= 1e-4 at every position;
# quantized: <= 1e-2 and the same argmax where the top-2 margin is > 0.05).
# Not bit-identical: a row-parallel matmul's sum is split between processes.
# Also: decode one token at a time, expert offloading on every rank, and the
# errors of a bad setup.
set -euo pipefail
MOLE=${MOLE_BIN:?}
SRC=${MOLE_SOURCE_DIR:?}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() {
  echo "FAIL: $*" >&2
  exit 1
}
command -v mpirun > /dev/null || fail "mpirun not found (openmpi-bin)"
MPI=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader --bind-to none)
# Under ASan, Open MPI's own allocations (in components it dlopen()s and
# unloads, so their stacks have no module to suppress by) read as leaks at
# exit: the ranks run with leak detection off and every other ASan/UBSan
# check on. mole's code on these paths is leak-checked in the single-process
# tests and under valgrind.
if [ "${MOLE_ASAN:-0}" = 1 ]; then
  MPI+=(-x "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0")  # the last setting wins
fi
M=$SRC/tests/data/conformance/models
TOK=$(seq -s, 1 3 70)  # 24 tokens

compare() {  # ref out tol label
  python3 - "$@" <<'PY'
import array, math, sys
ref, out, tol, label = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
a = array.array("f", open(ref, "rb").read()); b = array.array("f", open(out, "rb").read())
if len(a) != len(b):
    sys.exit("%s: %d logits, reference %d" % (label, len(b), len(a)))
V = 512
worst = 0.0
for i in range(len(a) // V):
    r = a[i * V:(i + 1) * V]; o = b[i * V:(i + 1) * V]
    e = math.sqrt(sum((x - y) ** 2 for x, y in zip(r, o))) / math.sqrt(sum(x * x for x in r))
    worst = max(worst, e)
    top = sorted(range(V), key=lambda j: -r[j])
    if tol >= 1e-2 and r[top[0]] - r[top[1]] > 0.05 and max(range(V), key=lambda j: o[j]) != top[0]:
        sys.exit("%s: argmax differs at position %d" % (label, i))
if not worst <= tol:
    sys.exit("%s: worst relative error %.3g > %g" % (label, worst, tol))
print("%-40s worst rel err %.2e" % (label, worst))
PY
}

run() {  # model np mode extra... -> T/out.f32
  local model=$1 np=$2 mode=$3
  shift 3
  "${MPI[@]}" -np "$np" "$MOLE" logits -m "$M/$model.gguf" --tokens "$TOK" -o "$T/out.f32" --kv-type f32 -t 1 \
    --parallel "$mode" "$@" > "$T/mpi.log" 2>&1 || { cat "$T/mpi.log" >&2; fail "$model np $np $mode $*"; }
}

printf '{"mode": "hmp", "ranks": [{"heads": 3, "ffn": 3, "seq": 3, "vocab": 3}, {"heads": 1, "ffn": 1, "seq": 1, "vocab": 1}]}' > "$T/plan2.json"
printf '{"mode": "hmp", "ranks": [{"heads": 1, "ffn": 2, "seq": 1, "vocab": 3}, {"heads": 0, "ffn": 1, "seq": 2, "vocab": 1}, {"heads": 1, "ffn": 1, "seq": 0, "vocab": 1}]}' > "$T/plan3.json"

for model in llama-dense mixtral qwen3moe olmoe qwen2moe mixtral-q8_0 mixtral-q4_k_m; do
  "$MOLE" logits -m "$M/$model.gguf" --tokens "$TOK" -o "$T/ref.f32" --kv-type f32 -t 1
  tol=1e-4
  case $model in *q8_0 | *q4_k_m) tol=1e-2 ;; esac
  run "$model" 2 tp && compare "$T/ref.f32" "$T/out.f32" $tol "$model tp N=2"
  run "$model" 3 hmp && compare "$T/ref.f32" "$T/out.f32" $tol "$model hmp N=3"
  run "$model" 4 tp && compare "$T/ref.f32" "$T/out.f32" $tol "$model tp N=4"
  run "$model" 4 hmp --no-overlap && compare "$T/ref.f32" "$T/out.f32" $tol "$model hmp N=4 no overlap"
  run "$model" 2 hmp --plan "$T/plan2.json" && compare "$T/ref.f32" "$T/out.f32" $tol "$model hmp N=2 shares 3:1"
  run "$model" 3 hmp --plan "$T/plan3.json" && compare "$T/ref.f32" "$T/out.f32" $tol "$model hmp N=3 uneven shares"
done

# a prompt with offloaded experts on every rank (hmp: the MoE exchange reads them chunk by chunk)
"$MOLE" logits -m "$M/mixtral.gguf" --tokens "$TOK" -o "$T/ref.f32" --kv-type f32 -t 1
run mixtral 3 hmp --expert-budget 30% --io pread && compare "$T/ref.f32" "$T/out.f32" 1e-4 "mixtral hmp N=3 offloaded"

# decode: one token per pass (the KV cache path), and offloaded experts on every rank
"$MOLE" logits -m "$M/mixtral.gguf" --tokens "$TOK" -o "$T/ref.f32" --kv-type f32 -t 1 --one-by-one
run mixtral 3 hmp --one-by-one && compare "$T/ref.f32" "$T/out.f32" 1e-4 "mixtral hmp N=3 one by one"
run mixtral 2 tp --one-by-one --expert-budget 30% --io pread && compare "$T/ref.f32" "$T/out.f32" 1e-4 "mixtral tp N=2 offloaded"

# the whole vocabulary on the root (what mole plan picks on a slow link):
# the others compute no logits and nothing is gathered
printf '{"mode": "hmp", "ranks": [{"heads": 1, "ffn": 1, "seq": 1, "vocab": 1}, {"heads": 1, "ffn": 1, "seq": 1, "vocab": 0}, {"heads": 1, "ffn": 2, "seq": 1, "vocab": 0}]}' > "$T/planv.json"
run mixtral 3 hmp --one-by-one --plan "$T/planv.json" && compare "$T/ref.f32" "$T/out.f32" 1e-4 "mixtral hmp N=3 vocabulary on the root"
run mixtral 3 tp --one-by-one --plan "$T/planv.json" && compare "$T/ref.f32" "$T/out.f32" 1e-4 "mixtral tp N=3 vocabulary on the root"

# waits that nap (MOLE_DIST_WAIT=nap, what a rank under a CPU quota does)
# on rank 1 only: every rank must still use the same kind of collective
# (a blocking one does not match a non-blocking one: the run would hang)
cat > "$T/nap1.sh" << 'EOF'
#!/usr/bin/env bash
[ "$OMPI_COMM_WORLD_RANK" = 1 ] && export MOLE_DIST_WAIT=nap
exec "$@"
EOF
chmod +x "$T/nap1.sh"
for mode in "tp" "hmp" "hmp --no-overlap"; do
  # shellcheck disable=SC2086
  timeout 120 "${MPI[@]}" -np 3 "$T/nap1.sh" "$MOLE" logits -m "$M/mixtral.gguf" --tokens "$TOK" -o "$T/out.f32" \
    --kv-type f32 -t 1 --one-by-one --parallel $mode > "$T/mpi.log" 2>&1 || { cat "$T/mpi.log" >&2; fail "rank 1 napping, $mode"; }
  compare "$T/ref.f32" "$T/out.f32" 1e-4 "mixtral $mode N=3, rank 1 naps"
done
if "${MPI[@]}" -np 2 -x MOLE_DIST_WAIT=doze "$MOLE" logits -m "$M/mixtral.gguf" --tokens 1 -o "$T/x" --parallel hmp > "$T/err" 2>&1; then
  fail "MOLE_DIST_WAIT=doze"
fi
grep -q "MOLE_DIST_WAIT=doze: expected spin, nap or auto" "$T/err" || fail "MOLE_DIST_WAIT message: $(cat "$T/err")"

# only rank 0 prints
"${MPI[@]}" -np 3 "$MOLE" run -m "$M/mixtral.gguf" --tokens 1,2,3 --ids -n 4 --seed 1 -t 1 --parallel hmp > "$T/run.out" 2> "$T/run.err" ||
  fail "mole run under mpirun"
[ "$(wc -l < "$T/run.out")" -le 2 ] || fail "more than rank 0 printed: $(cat "$T/run.out")"

# bad setups: clear errors
if "$MOLE" logits -m "$M/mixtral.gguf" --tokens 1 -o "$T/x" --parallel hmp 2> "$T/err"; then fail "--parallel without mpirun"; fi
grep -q mpirun "$T/err" || fail "no word of mpirun: $(cat "$T/err")"
if "${MPI[@]}" -np 2 "$MOLE" logits -m "$M/mixtral.gguf" --tokens 1 -o "$T/x" --plan "$T/plan3.json" > "$T/err" 2>&1; then
  fail "a 3-process plan on 2"
fi
grep -q "plan for 3 processes" "$T/err" || fail "plan size: $(cat "$T/err")"
echo '{"ranks": "x"}' > "$T/bad.json"
if "${MPI[@]}" -np 2 "$MOLE" logits -m "$M/mixtral.gguf" --tokens 1 -o "$T/x" --plan "$T/bad.json" > "$T/err" 2>&1; then
  fail "a bad plan"
fi
grep -q "not a plan" "$T/err" || fail "bad plan message: $(cat "$T/err")"
# shares that are all 0 for some kind of work, or an unknown mode: named, not a 0/0 cut
R0='{"heads": 0, "ffn": 1, "seq": 1, "vocab": 1}'
echo "{\"mode\": \"hmp\", \"ranks\": [$R0, $R0]}" > "$T/zero.json"
echo '{"mode": "pp", "ranks": [{"heads": 1, "ffn": 1, "seq": 1, "vocab": 1}, {"heads": 1, "ffn": 1, "seq": 1, "vocab": 1}]}' > "$T/mode.json"
for b in zero:"every rank's heads share is 0" mode:'mode must be "hmp" or "tp"'; do
  if "${MPI[@]}" -np 2 "$MOLE" logits -m "$M/mixtral.gguf" --tokens 1 -o "$T/x" --plan "$T/${b%%:*}.json" > "$T/err" 2>&1; then
    fail "plan ${b%%:*} accepted"
  fi
  grep -qF "${b#*:}" "$T/err" || fail "plan ${b%%:*} message: $(cat "$T/err")"
done
echo "cli_dist: ok"
