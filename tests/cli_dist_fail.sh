#!/usr/bin/env bash
# One rank fails, every rank exits with its error (mpirun --oversubscribe on
# this machine), instead of the others waiting forever or an MPI_Abort:
#  - a model file that rank 1 cannot open (a wrapper gives rank 1 a path that
#    does not exist): the load of tp, hmp and --disagg, mole plan and mole
#    plan --disagg fail on every rank with "rank 1: ... cannot open";
#  - rank 1 out of memory making room for its first pass (MOLE_TEST_FAIL_RANK=1
#    injects it): tp, hmp and --disagg (rank 1 an attention rank, then an
#    expert rank) fail on every rank with "rank 1: out of memory";
# each within a time limit (a rank left waiting would hang the job), every
# process printing the error, none aborting.
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
if [ "${MOLE_ASAN:-0}" = 1 ]; then  # Open MPI's own allocations read as leaks (see cli_dist.sh)
  MPI+=(-x "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0")
fi
M=$SRC/tests/data/conformance/models/mixtral.gguf

# rank 1 gets a model path that does not exist
cat > "$T/missing1.sh" << EOF
#!/usr/bin/env bash
args=()
for a in "\$@"; do
  if [ "\$OMPI_COMM_WORLD_RANK" = 1 ] && [ "\$a" = "$M" ]; then a=$T/absent.gguf; fi
  args+=("\$a")
done
exec "\${args[@]}"
EOF
chmod +x "$T/missing1.sh"

# fails NP PATTERN LABEL cmd...: the job fails within 120 s, each of the NP
# processes prints PATTERN (all the same error), and none aborts
fails() {
  local np=$1 pat=$2 label=$3 rc=0
  shift 3
  timeout 120 "${MPI[@]}" -np "$np" "$@" > "$T/out.log" 2>&1 || rc=$?
  [ "$rc" != 0 ] || { cat "$T/out.log" >&2; fail "$label: the job succeeded"; }
  [ "$rc" != 124 ] || { cat "$T/out.log" >&2; fail "$label: the job hung (killed after 120 s)"; }
  local n
  n=$(grep -cF -- "$pat" "$T/out.log" || true)
  [ "$n" -ge "$np" ] || { cat "$T/out.log" >&2; fail "$label: $n of $np processes printed '$pat'"; }
  ! grep -qi "mpi_abort\|assertion failed" "$T/out.log" || { cat "$T/out.log" >&2; fail "$label: a rank aborted"; }
  echo "$label: every rank exits with '$pat'"
}

LOGITS=(logits -m "$M" --tokens 1,2,3,4 -o "$T/out.f32" -t 1)
NOFILE="rank 1: $T/absent.gguf"
fails 2 "$NOFILE" "tp, model missing on rank 1" "$T/missing1.sh" "$MOLE" "${LOGITS[@]}" --parallel tp
fails 3 "$NOFILE" "hmp, model missing on rank 1" "$T/missing1.sh" "$MOLE" "${LOGITS[@]}" --parallel hmp
fails 3 "$NOFILE" "disagg, model missing on rank 1" "$T/missing1.sh" "$MOLE" "${LOGITS[@]}" --disagg attn=2,expert=1
fails 2 "$NOFILE" "plan, model missing on rank 1" "$T/missing1.sh" "$MOLE" plan -m "$M" -t 1 -o "$T/plan.json"
fails 3 "$NOFILE" "plan --disagg, model missing on rank 1" "$T/missing1.sh" "$MOLE" plan --disagg -m "$M" -t 1 \
  --seqs 2 --ctx 64 -o "$T/plan.json"

OOM="rank 1: out of memory (injected: MOLE_TEST_FAIL_RANK=1)"
fails 2 "$OOM" "tp, rank 1 out of memory" -x MOLE_TEST_FAIL_RANK=1 "$MOLE" "${LOGITS[@]}" --parallel tp
fails 3 "$OOM" "hmp, rank 1 out of memory" -x MOLE_TEST_FAIL_RANK=1 "$MOLE" "${LOGITS[@]}" --parallel hmp
fails 3 "$OOM" "disagg, attention rank 1 out of memory" -x MOLE_TEST_FAIL_RANK=1 "$MOLE" "${LOGITS[@]}" \
  --disagg attn=2,expert=1
fails 2 "$OOM" "disagg, expert rank 1 out of memory" -x MOLE_TEST_FAIL_RANK=1 "$MOLE" "${LOGITS[@]}" \
  --disagg attn=1,expert=1
echo "cli_dist_fail: ok"
