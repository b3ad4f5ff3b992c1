#!/usr/bin/env bash
# `make bench`, part 4: one model over several processes (mole --parallel),
# each rank in its own network namespace, joined by veth links to a bridge
# and limited with tc netem (unshaped, 1 Gbit/s + 0.2 ms, 100 Mbit/s + 1 ms):
# latency per token of decode and of a prompt at N = 2 and 4 for tp, hmp
# without overlap and hmp with overlap; the bytes the ranks' interfaces sent
# per decode token next to the formula; then ranks of unequal speed (a CPU
# quota on rank 1 through a cgroup) with mole plan's shares against equal
# shares; then a model larger than one rank's memory limit (cgroup) across
# two ranks under their own limits. Needs root (netns, tc, cgroups); every
# run in bench/out/dist-runs.tsv, the table in bench/out/dist.txt, a plot in
# bench/out/dist.png.
set -euo pipefail
cd "$(dirname "$0")/.."
MOLE=$(realpath "${MOLE:-build/mole}")
M=${DIST_MODEL:-models/bench/synth-r2-l8/synth-q4_0.gguf}
PP=${PP:-128}
TG=${TG:-16}
OUT=bench/out
mkdir -p "$OUT"
if [ "$(id -u)" -ne 0 ] || ! command -v mpirun > /dev/null; then
  echo "bench/dist: needs root (network namespaces, tc, cgroups) and mpirun: skipped" >&2
  exit 0
fi
if [ ! -f "$M" ]; then
  mkdir -p "$(dirname "$M")"
  "$MOLE" synth --arch mixtral --embd 1024 --layers 8 --experts 8 --used 2 --ff 3584 --vocab 32000 --type q4_0 \
    --seed 7 -o "$M.tmp" >&2
  mv "$M.tmp" "$M"
fi
M=$(realpath "$M")
NMAX=4
NET=10.77.0

teardown() {
  for r in $(seq 0 $((NMAX - 1))); do ip netns del "mole_ns$r" 2> /dev/null || true; done
  ip link del mole_br 2> /dev/null || true
  for r in $(seq 0 $((NMAX - 1))); do
    rmdir "/sys/fs/cgroup/cpu/mole_r$r" 2> /dev/null || true
    rmdir "/sys/fs/cgroup/memory/mole_r$r" 2> /dev/null || true
  done
}
trap teardown EXIT
teardown
ip link add mole_br type bridge
ip addr add $NET.254/24 dev mole_br
ip link set mole_br up
for r in $(seq 0 $((NMAX - 1))); do
  ip netns add "mole_ns$r"
  ip link add "mole_v$r" type veth peer name "mole_p$r"
  ip link set "mole_p$r" netns "mole_ns$r"
  ip link set "mole_v$r" master mole_br
  ip link set "mole_v$r" up
  ip netns exec "mole_ns$r" ip addr add "$NET.$((r + 1))/24" dev "mole_p$r"
  ip netns exec "mole_ns$r" ip link set "mole_p$r" up
  ip netns exec "mole_ns$r" ip link set lo up
done

shape() {  # rate ("" = none): on each rank's way out, so every message crosses one limited link
  for r in $(seq 0 $((NMAX - 1))); do
    ip netns exec "mole_ns$r" tc qdisc del dev "mole_p$r" root 2> /dev/null || true
    [ -n "$1" ] && ip netns exec "mole_ns$r" tc qdisc add dev "mole_p$r" root tbf rate "$1" burst 256kb latency 200ms
  done
  return 0
}

# each rank enters its namespace (and its cgroups, when they exist) before it starts
WRAP=$OUT/dist-rank.sh
cat > "$WRAP" << 'EOF'
#!/usr/bin/env bash
r=$OMPI_COMM_WORLD_RANK
for c in cpu memory; do
  [ -d "/sys/fs/cgroup/$c/mole_r$r" ] && echo $$ > "/sys/fs/cgroup/$c/mole_r$r/cgroup.procs"
done
exec ip netns exec "mole_ns$r" "$@"
EOF
chmod +x "$WRAP"
export PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include=$NET.0/24
MPI=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x PMIX_MCA_ptl_tcp_remote_connections
     -x PMIX_MCA_ptl_tcp_if_include --mca btl tcp,self --mca btl_tcp_if_include $NET.0/24
     --mca oob_tcp_if_include $NET.0/24)

tx_total() {  # bytes sent by ranks 0..n-1 so far
  local s=0
  for r in $(seq 0 $(($1 - 1))); do
    s=$((s + $(ip netns exec "mole_ns$r" cat "/sys/class/net/mole_p$r/statistics/tx_bytes")))
  done
  echo $s
}

runs=$OUT/dist-runs.tsv
printf "link\tN\tmode\tpp_tps\ttg_tps\ttx_bytes_per_token\tformula_bytes_per_token\n" > "$runs"
bench1() {  # link N mode flags...
  local link=$1 n=$2 mode=$3
  shift 3
  local b0 b1 j
  b0=$(tx_total "$n")
  j=$("${MPI[@]}" -np "$n" "$WRAP" "$MOLE" bench -m "$M" -p "$PP" -n "$TG" -r 1 -t 1 --json "$@" 2> "$OUT/dist-err.log") ||
    { cat "$OUT/dist-err.log" >&2; return 1; }
  b1=$(tx_total "$n")
  python3 - "$link" "$n" "$mode" "$j" "$((b1 - b0))" "$PP" "$TG" >> "$runs" << 'PY'
import json, sys
link, n, mode, j, tx, pp, tg = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]), int(sys.argv[7])
E, L, V = 1024, 8, 32000
# per decode token: every layer's two tensor-parallel blocks move one row of E floats
# around the ring each way (tp: an all-reduce = reduce-scatter + all-gather; hmp:
# an all-gather before and a reduce-scatter after), (N-1) * E * 4 bytes each way;
# hmp also gathers the last x (one row); the root gathers the others' vocabulary rows
ring = 2 * 2 * (n - 1) * E * 4 * L
formula = ring + (n - 1) * V // n * 4 + (4 * (n - 1) * E if mode.startswith("hmp") else 0)
# the warm-up token, the prompt and the 16 tokens all moved bytes: count per token of all
tokens = 1 + pp + tg
print("%s\t%d\t%s\t%.2f\t%.2f\t%.0f\t%d" % (link, n, mode, j["pp_tps"], j["tg_tps"], tx / tokens, formula))
PY
  tail -n 1 "$runs" >&2
}

for link in none 1gbit 100mbit; do
  if [ "$link" = none ]; then shape ""; else shape "$link"; fi
  for n in 2 4; do
    bench1 "$link" "$n" tp --parallel tp
    bench1 "$link" "$n" hmp --parallel hmp --no-overlap
    bench1 "$link" "$n" hmp+overlap --parallel hmp
  done
done
shape ""

# unequal speed: rank 1 gets 35% of a core
mkdir -p /sys/fs/cgroup/cpu/mole_r1
echo 100000 > /sys/fs/cgroup/cpu/mole_r1/cpu.cfs_period_us
echo 35000 > /sys/fs/cgroup/cpu/mole_r1/cpu.cfs_quota_us
"${MPI[@]}" -np 2 "$WRAP" "$MOLE" plan -m "$M" -t 1 -o "$(realpath "$OUT")/dist-plan.json" 2> "$OUT/dist-err.log" ||
  { cat "$OUT/dist-err.log" >&2; exit 1; }
bench1 quota35 2 hmp-equal --parallel hmp
bench1 quota35 2 hmp-planned --parallel hmp --plan "$(realpath "$OUT")/dist-plan.json"
rmdir /sys/fs/cgroup/cpu/mole_r1

# a model larger than one rank's memory limit: two ranks, each under its limit
BIG=${DIST_BIG_MODEL:-models/bench/synth-r2-l8/synth-q8_0.gguf}
if [ -f "$BIG" ]; then
  BIG=$(realpath "$BIG")
  size=$(stat -c %s "$BIG")
  lim=$((size * 7 / 10))  # 70% of the model: one process cannot hold it, half of it fits
  for r in 0 1; do
    mkdir -p "/sys/fs/cgroup/memory/mole_r$r"
    echo $lim > "/sys/fs/cgroup/memory/mole_r$r/memory.limit_in_bytes"
  done
  "$MOLE" logits -m "$BIG" --tokens 1,2,3,4,5,6,7,8 -o "$OUT/dist-ref.f32" --kv-type f32 -t 1 --mmap
  "${MPI[@]}" -np 2 "$WRAP" "$MOLE" logits -m "$BIG" --tokens 1,2,3,4,5,6,7,8 -o "$(realpath "$OUT")/dist-mem.f32" \
    --kv-type f32 -t 1 --parallel hmp 2> "$OUT/dist-err.log" || { cat "$OUT/dist-err.log" >&2; exit 1; }
  python3 - "$OUT/dist-ref.f32" "$OUT/dist-mem.f32" "$lim" "$size" << 'PY' | tee "$OUT/dist-mem.txt"
import array, math, sys
a = array.array("f", open(sys.argv[1], "rb").read()); b = array.array("f", open(sys.argv[2], "rb").read())
V = len(a) // 8
w = max(math.sqrt(sum((a[i*V+j]-b[i*V+j])**2 for j in range(V))) / math.sqrt(sum(a[i*V+j]**2 for j in range(V))) for i in range(8))
peaks = []
for r in (0, 1):
    p = "/sys/fs/cgroup/memory/mole_r%d/" % r
    peaks.append((int(open(p + "memory.max_usage_in_bytes").read()), int(open(p + "memory.failcnt").read())))
print("model %.0f MiB, limit %.0f MiB per rank: peaks %s MiB, failcnt %s, worst rel err vs one process %.2e" % (
    int(sys.argv[4]) / 2**20, int(sys.argv[3]) / 2**20, [round(p / 2**20) for p, _ in peaks], [f for _, f in peaks], w))
PY
  for r in 0 1; do rmdir "/sys/fs/cgroup/memory/mole_r$r"; done
fi

python3 - "$runs" << 'PY' | tee "$OUT/dist.txt"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
print("%-14s %2s %-12s %11s %11s %13s %13s" % ("link", "N", "mode", "prompt ms/t", "decode ms/t", "sent B/token", "formula B/t"))
for r in rows:
    print("%-14s %2s %-12s %11.2f %11.2f %13s %13s" % (r["link"], r["N"], r["mode"], 1e3 / float(r["pp_tps"]),
          1e3 / float(r["tg_tps"]), r["tx_bytes_per_token"], r["formula_bytes_per_token"]))
PY
if command -v gnuplot > /dev/null; then
  python3 - "$runs" > "$OUT/dist-plot.dat" << 'PY'
import csv, sys
rows = [r for r in csv.DictReader(open(sys.argv[1]), delimiter="\t") if not r["link"].startswith("quota")]
for i, r in enumerate(rows):
    print(i, '"%s N=%s %s"' % (r["link"], r["N"], r["mode"]), 1e3 / float(r["pp_tps"]), 1e3 / float(r["tg_tps"]))
PY
  gnuplot << 'GP'
set terminal pngcairo size 1100,500
set output "bench/out/dist.png"
set style data histograms
set style fill solid 0.8
set ylabel "ms per token"
set xtics rotate by -45 font ",8"
set key top left
plot "bench/out/dist-plot.dat" using 3:xtic(2) title "prompt", "" using 4 title "decode"
GP
fi
