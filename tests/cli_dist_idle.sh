#!/usr/bin/env bash
# Several processes, the parts that are about time rather than logits:
#  - the ranks of `mpirun ... mole serve --parallel hmp` waiting for requests
#    use (almost) no CPU: a worker waits for the root's next step sleeping,
#    not spinning in MPI_Bcast (it used 94% of a core);
#  - `mole plan` sees a rank under a CPU quota (cgroup v1 cpu.cfs_quota_us,
#    30% of a core) at the speed it keeps and gives it the smaller share (a
#    best-of-bursts profile fitted in one quota period and saw equal speeds).
#    Needs root and a writable cgroup v1 cpu controller, else skipped.
#  - `mole plan` over a 100 Mbit/s link (two network namespaces, a veth pair,
#    tc tbf) puts the whole vocabulary on rank 0, and runs with that plan give
#    one process's logits. Needs root and tc, else skipped.
set -uo pipefail
MOLE=${MOLE_BIN:?}
SRC=${MOLE_SOURCE_DIR:?}
T=$(mktemp -d)
CG=/sys/fs/cgroup/cpu/mole-test-$$
SRV=
NS=molet$$
cleanup() {
  [ -n "$SRV" ] && kill "$SRV" 2> /dev/null && wait "$SRV" 2> /dev/null
  for r in 0 1; do
    ip link del "${NS}v$r" 2> /dev/null
    ip netns del "${NS}_$r" 2> /dev/null
  done
  ip link del "${NS}br" 2> /dev/null
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

# T/out.f32 against T/ref.f32 (one process): relative error <= 1e-4 at every position
same_logits() {  # label
  python3 - "$T/ref.f32" "$T/out.f32" "$1" << 'PY'
import array, math, sys
a = array.array("f", open(sys.argv[1], "rb").read()); b = array.array("f", open(sys.argv[2], "rb").read())
assert len(a) == len(b), (len(a), len(b))
V = 512
w = max(math.sqrt(sum((a[i*V+j]-b[i*V+j])**2 for j in range(V))) / math.sqrt(sum(a[i*V+j]**2 for j in range(V))) for i in range(len(a)//V))
print("%s: logits worst rel err %.2e" % (sys.argv[3], w))
sys.exit(0 if w <= 1e-4 else 1)
PY
}

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
  same_logits "quota plan" || fail "logits under a quota differ from one process's"
fi
# 3. mole plan over a slow link: the vocabulary goes to the root
if [ "${MOLE_ASAN:-0}" = 1 ]; then
  echo "slow-link plan: skipped under ASan"
elif [ "$(id -u)" != 0 ] || ! command -v tc > /dev/null || ! command -v nsenter > /dev/null ||
  ! ip netns add "${NS}_0" 2> /dev/null; then
  echo "slow-link plan: skipped (needs root, ip netns, tc and nsenter)"
else
  # a bridge on the host (mpirun's PMIx server is there), a veth into each namespace
  ip netns add "${NS}_1" || fail "ip netns add"
  ip link add "${NS}br" type bridge && ip addr add 10.78.0.254/24 dev "${NS}br" && ip link set "${NS}br" up ||
    fail "bridge"
  for r in 0 1; do
    ip link add "${NS}v$r" type veth peer name "${NS}p$r" || fail "veth"
    ip link set "${NS}p$r" netns "${NS}_$r" && ip link set "${NS}v$r" master "${NS}br" && ip link set "${NS}v$r" up ||
      fail "veth $r"
    ip netns exec "${NS}_$r" ip addr add "10.78.0.$((r + 1))/24" dev "${NS}p$r"
    ip netns exec "${NS}_$r" ip link set "${NS}p$r" up
    ip netns exec "${NS}_$r" ip link set lo up
    ip netns exec "${NS}_$r" tc qdisc add dev "${NS}p$r" root tbf rate 100mbit burst 4kb latency 200ms || fail "tc tbf"
  done
  cat > "$T/wrapn.sh" << EOF
#!/usr/bin/env bash
exec nsenter --net=/run/netns/${NS}_\$OMPI_COMM_WORLD_RANK "\$@"
EOF
  chmod +x "$T/wrapn.sh"
  export PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include=10.78.0.0/24
  NMPI=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x PMIX_MCA_ptl_tcp_remote_connections
    -x PMIX_MCA_ptl_tcp_if_include --mca btl tcp,self --mca btl_tcp_if_include 10.78.0.0/24 --mca oob_tcp_if_include 10.78.0.0/24)
  timeout 120 "${NMPI[@]}" -np 2 "$T/wrapn.sh" "$MOLE" plan -m "$M" -t 1 -o "$T/plan-slow.json" > "$T/plan.log" 2>&1 ||
    { cat "$T/plan.log" >&2; fail "mole plan over a 100 Mbit/s link"; }
  python3 - "$T/plan-slow.json" << 'PY' || fail "slow-link plan: $(cat "$T/plan-slow.json")"
import json, sys
p = json.load(open(sys.argv[1]))
v = p["vocabulary"]
print("slow-link plan: vocabulary on the %s (gathered %.2f ms, root alone %.2f ms), link %.3f GB/s" % (
      v["placed"], v["split_ms"], v["root_ms"], p["ranks"][1]["profile"]["link_gbs"]))
sys.exit(0 if v["placed"] == "root" and p["ranks"][0]["vocab"] == 1 and p["ranks"][1]["vocab"] == 0 else 1)
PY
  TOK=$(seq -s, 1 3 70)
  "$MOLE" logits -m "$M" --tokens "$TOK" -o "$T/ref.f32" --kv-type f32 -t 1 --one-by-one > /dev/null 2>&1 || fail "logits, one process"
  timeout 120 "${NMPI[@]}" -np 2 "$T/wrapn.sh" "$MOLE" logits -m "$M" --tokens "$TOK" -o "$T/out.f32" --kv-type f32 -t 1 \
    --one-by-one --plan "$T/plan-slow.json" > "$T/run.log" 2>&1 || { cat "$T/run.log" >&2; fail "logits with the slow-link plan"; }
  same_logits "slow-link plan" || fail "logits with the slow-link plan differ"
fi
echo "cli_dist_idle: ok"
