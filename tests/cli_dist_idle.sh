#!/usr/bin/env bash
# Several processes, the parts that are about time rather than logits:
#  - the ranks of `mpirun ... mole serve --parallel hmp` waiting for requests
#    use (almost) no CPU: a worker waits for the root's next step sleeping,
#    not spinning in MPI_Bcast (it used 94% of a core);
#  - `mole plan` sees a rank under a CPU quota (cgroup v1 cpu.cfs_quota_us,
#    30% of a core) at the speed it keeps and gives it the smaller share (a
#    best-of-bursts profile fitted in one quota period and saw equal speeds).
#    Needs root and a writable cgroup v1 cpu controller, else skipped.
set -uo pipefail
MOLE=${MOLE_BIN:?}
SRC=${MOLE_SOURCE_DIR:?}
T=$(mktemp -d)
CG=/sys/fs/cgroup/cpu/mole-test-$$
SRV=
cleanup() {
  [ -n "$SRV" ] && kill "$SRV" 2> /dev/null && wait "$SRV" 2> /dev/null
  if [ -d "$CG" ]; then
    while read -r p; do echo "$p" > /sys/fs/cgroup/cpu/cgroup.procs 2> /dev/null; done < "$CG/cgroup.procs"
    rmdir "$CG" 2> /dev/null
  fi
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
# Open MPI's allocations in components it unloads read as leaks under ASan (see cli_dist.sh)
[ "${MOLE_ASAN:-0}" = 1 ] && MPI+=(-x "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0")
M=$SRC/tests/data/conformance/models/mixtral.gguf

# CPU seconds (user + system) a process has used, from /proc
cpu_s() { awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$1/stat"; }

# 1. idle ranks of a server
"${MPI[@]}" -np 2 "$MOLE" serve -m "$M" -t 1 --port 0 --parallel hmp > "$T/srv.log" 2>&1 &
SRV=$!
for _ in $(seq 300); do
  grep -q "listening on" "$T/srv.log" && break
  kill -0 "$SRV" 2> /dev/null || { cat "$T/srv.log" >&2; fail "the server under mpirun exited"; }
  sleep 0.2
done
grep -q "listening on" "$T/srv.log" || { cat "$T/srv.log" >&2; fail "the server under mpirun did not come up"; }
sleep 1  # past start-up
pids=$(pgrep -P "$SRV" | tr '\n' ' ')  # the ranks: mpirun's children
[ "$(echo $pids | wc -w)" -eq 2 ] || fail "expected 2 ranks, found: $pids"
declare -A c0
for p in $pids; do c0[$p]=$(cpu_s "$p"); done
sleep 3
for p in $pids; do
  used=$(awk -v a="${c0[$p]}" -v b="$(cpu_s "$p")" 'BEGIN { printf "%.2f", (b - a) / 3 }')
  echo "rank process $p: $used of a core while idle"
  awk -v u="$used" 'BEGIN { exit !(u < 0.25) }' || fail "an idle rank used $used of a core (spinning?)"
done
stop_mpirun "$SRV" INT
SRV=

# 2. mole plan with rank 1 under a 30% CPU quota
if [ "${MOLE_ASAN:-0}" = 1 ]; then
  echo "quota plan: skipped under ASan"
elif [ "$(id -u)" != 0 ] || ! mkdir "$CG" 2> /dev/null; then
  echo "quota plan: skipped (no writable cgroup v1 cpu controller; needs root)"
else
  echo 100000 > "$CG/cpu.cfs_period_us"
  echo 30000 > "$CG/cpu.cfs_quota_us"
  cat > "$T/wrap.sh" << EOF
#!/usr/bin/env bash
[ "\$OMPI_COMM_WORLD_RANK" = 1 ] && echo \$\$ > "$CG/cgroup.procs"
exec "\$@"
EOF
  chmod +x "$T/wrap.sh"
  "${MPI[@]}" -np 2 "$T/wrap.sh" "$MOLE" plan -m "$M" -t 1 -o "$T/plan.json" > "$T/plan.log" 2>&1 ||
    { cat "$T/plan.log" >&2; fail "mole plan under a quota"; }
  python3 - "$T/plan.json" << 'PY' || fail "plan: $(cat "$T/plan.json")"
import json, sys
p = json.load(open(sys.argv[1]))
r0, r1 = p["ranks"][0], p["ranks"][1]
print("quota plan: shares %.2f / %.2f, decode %.1f / %.1f GB/s" % (r0["heads"], r1["heads"], r0["profile"]["decode_gbs"],
      r1["profile"]["decode_gbs"]))
sys.exit(0 if r1["heads"] < 0.4 and r1["profile"]["decode_gbs"] < 0.6 * r0["profile"]["decode_gbs"] else 1)
PY
  # the plan runs, rank 1 napping in its waits (it sees its quota) while rank 0
  # spins: the same logits as one process (non-blocking collectives on both)
  TOK=$(seq -s, 1 3 70)
  "$MOLE" logits -m "$M" --tokens "$TOK" -o "$T/ref.f32" --kv-type f32 -t 1 > /dev/null 2>&1 || fail "logits, one process"
  timeout 120 "${MPI[@]}" -np 2 "$T/wrap.sh" "$MOLE" logits -m "$M" --tokens "$TOK" -o "$T/out.f32" --kv-type f32 -t 1 \
    --parallel hmp --plan "$T/plan.json" > "$T/run.log" 2>&1 || { cat "$T/run.log" >&2; fail "logits with the plan under a quota"; }
  python3 - "$T/ref.f32" "$T/out.f32" << 'PY' || fail "logits under a quota differ from one process's"
import array, math, sys
a = array.array("f", open(sys.argv[1], "rb").read()); b = array.array("f", open(sys.argv[2], "rb").read())
assert len(a) == len(b), (len(a), len(b))
V = 512
w = max(math.sqrt(sum((a[i*V+j]-b[i*V+j])**2 for j in range(V))) / math.sqrt(sum(a[i*V+j]**2 for j in range(V))) for i in range(len(a)//V))
print("quota plan: logits worst rel err %.2e" % w)
sys.exit(0 if w <= 1e-4 else 1)
PY
fi
echo "cli_dist_idle: ok"
