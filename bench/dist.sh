#!/usr/bin/env bash
# `make bench`, part 4: one model over several processes (mole --parallel),
# each rank in its own network namespace, joined by veth links to a bridge
# and rate-limited with tc tbf (unshaped, 1 Gbit/s, 100 Mbit/s, with a
# bucket of a few packets; this kernel has no netem, so no added delay): latency per token of decode and of a
# prompt at N = 2 and 4 for tp, hmp without overlap and hmp with overlap
# (each a mean of 3 runs); the bytes the ranks' interfaces sent per decode
# token (the difference between a run of 8 and one of 40 generated tokens,
# so start-up and prompt traffic cancel) next to the formula, in all and per
# layer; then ranks of unequal speed (a CPU
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
TG=${TG:-32}
REPS=${REPS:-3}
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

# rate ("" = none) and bucket: on each rank's way out, so every message
# crosses one limited link. The bucket is a few packets (about 100 us of the
# link at 1 Gbit/s, 3 packets at 100 Mbit/s; both still carry 94-96% of the
# rate in a bulk transfer): a real link does not bank the time it sat idle,
# and a bucket of 256 KB let the burst after each block's computation leave
# at veth speed, which hid the transfer behind the computation for every
# mode alike.
shape() {
  for r in $(seq 0 $((NMAX - 1))); do
    ip netns exec "mole_ns$r" tc qdisc del dev "mole_p$r" root 2> /dev/null || true
    [ -n "$1" ] && ip netns exec "mole_ns$r" tc qdisc add dev "mole_p$r" root tbf rate "$1" burst "$2" latency 200ms
  done
  return 0
}

# each rank enters its cgroups (when they exist) and its network namespace
# before it starts; nsenter --net, not ip netns exec, which remounts /sys and
# so hides the cgroup files (a rank would not see its CPU quota or memory limit)
WRAP=$OUT/dist-rank.sh
cat > "$WRAP" << 'EOF'
#!/usr/bin/env bash
r=$OMPI_COMM_WORLD_RANK
for c in cpu memory; do
  [ -d "/sys/fs/cgroup/$c/mole_r$r" ] && echo $$ > "/sys/fs/cgroup/$c/mole_r$r/cgroup.procs"
done
exec nsenter --net="/run/netns/mole_ns$r" "$@"
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
printf "link\tN\tmode\tpp_tps\ttg_tps\n" > "$runs"
bench1() {  # link N mode flags...
  local link=$1 n=$2 mode=$3
  shift 3
  local j
  j=$("${MPI[@]}" -np "$n" "$WRAP" "$MOLE" bench -m "$M" -p "$PP" -n "$TG" -r "$REPS" -t 1 --json "$@" 2> "$OUT/dist-err.log") ||
    { cat "$OUT/dist-err.log" >&2; return 1; }
  python3 -c 'import json, sys; j = json.loads(sys.argv[4]); print("%s\t%s\t%s\t%.2f\t%.2f" % (sys.argv[1], sys.argv[2], sys.argv[3], j["pp_tps"], j["tg_tps"]))' \
    "$link" "$n" "$mode" "$j" >> "$runs"
  tail -n 1 "$runs" >&2
}

# bytes the ranks' interfaces sent per decode token: a run of 40 generated
# tokens minus one of 8 (start-up, wire-up and prompt traffic cancel), / 32
bytes=$OUT/dist-bytes.tsv
printf "N\tmode\tsent_per_token\tformula_per_token\tsent_per_layer\tformula_per_layer\n" > "$bytes"
bytes1() {  # N mode flags...
  local n=$1 mode=$2 b0 b1 b2 b3
  shift 2
  b0=$(tx_total "$n")
  "${MPI[@]}" -np "$n" "$WRAP" "$MOLE" bench -m "$M" -p 8 -n 8 -r 1 -t 1 "$@" > /dev/null 2> "$OUT/dist-err.log" ||
    { cat "$OUT/dist-err.log" >&2; return 1; }
  b1=$(tx_total "$n")
  "${MPI[@]}" -np "$n" "$WRAP" "$MOLE" bench -m "$M" -p 8 -n 40 -r 1 -t 1 "$@" > /dev/null 2> "$OUT/dist-err.log" ||
    { cat "$OUT/dist-err.log" >&2; return 1; }
  b2=$(tx_total "$n")
  python3 - "$n" "$mode" "$(((b2 - b1) - (b1 - b0)))" >> "$bytes" << 'PY'
import sys
n, mode, d = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
E, L, V = 1024, 8, 32000
sent = d / 32
# payload per decode token, all ranks: each layer's two tensor-parallel blocks
# move one row of E floats. hmp all-gathers the owner's row before a block
# and reduce-scatters the partial sums back to it after, both as rings:
# (N-1) E 4 bytes each, 4 (N-1) E 4 per layer. tp all-reduces the row with
# MPI_Allreduce, for which Open MPI picks recursive doubling at this size
# (every rank sends the whole row log2 N times: N log2 N E 4 bytes; for
# N = 2 the same as a ring's 2 (N-1) E 4), 2 N log2 N E 4 per layer. Then
# the other ranks' vocabulary rows of the logits go to rank 0, hmp gathers
# the last row of x for the output norm, and rank 0 broadcasts the step.
import math
layer = 4 * (n - 1) * E * 4 if mode.startswith("hmp") else 2 * n * int(math.log2(n)) * E * 4
formula = L * layer + (n - 1) * (V // n) * 4 + (4 * (n - 1) * E if mode.startswith("hmp") else 0) + 16 * (n - 1)
print("%d\t%s\t%.0f\t%d\t%.0f\t%d" % (n, mode, sent, formula, (sent - (formula - L * layer)) / L, layer))
PY
  tail -n 1 "$bytes" >&2
}
shape ""
for n in 2 4; do
  bytes1 "$n" tp --parallel tp
  bytes1 "$n" hmp --parallel hmp --no-overlap
  bytes1 "$n" hmp+overlap --parallel hmp
done

# 100mbit-rndv: the same link with Open MPI's own TCP defaults (eager limit
# 64 KiB; mole raises it to 4 MiB unless told otherwise): larger messages
# then go by rendezvous, which only progresses inside MPI calls
MPI_SAVED=("${MPI[@]}")
for link in none 1gbit 100mbit 100mbit-rndv; do
  MPI=("${MPI_SAVED[@]}")
  case $link in
    none) shape "" ;;
    1gbit) shape 1gbit 16kb ;;
    100mbit) shape 100mbit 4kb ;;
    100mbit-rndv)
      shape 100mbit 4kb
      MPI+=(--mca btl_tcp_eager_limit 65536 --mca btl_tcp_rndv_eager_limit 65536 --mca btl_tcp_max_send_size 131072)
      ;;
  esac
  for n in 2 4; do
    bench1 "$link" "$n" tp --parallel tp
    bench1 "$link" "$n" hmp --parallel hmp --no-overlap
    bench1 "$link" "$n" hmp+overlap --parallel hmp
  done
done
MPI=("${MPI_SAVED[@]}")
# mole plan on the slow link: it puts the whole vocabulary on the root when
# gathering the logits' rows over the link costs more than streaming the
# output matrix there alone (half of a decode token's bytes are those rows)
shape 100mbit 4kb
"${MPI[@]}" -np 2 "$WRAP" "$MOLE" plan -m "$M" -t 1 -o "$(realpath "$OUT")/dist-plan-slow.json" 2> "$OUT/dist-err.log" ||
  { cat "$OUT/dist-err.log" >&2; exit 1; }
python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print("plan on 100 Mbit/s: vocabulary", j["vocabulary"], file=sys.stderr)' \
  "$OUT/dist-plan-slow.json"
bench1 100mbit-plan 2 tp --parallel tp --plan "$(realpath "$OUT")/dist-plan-slow.json"
bench1 100mbit-plan 2 hmp+overlap --parallel hmp --plan "$(realpath "$OUT")/dist-plan-slow.json"
shape ""

# unequal speed: rank 1 gets 35% of a core
mkdir -p /sys/fs/cgroup/cpu/mole_r1
echo 100000 > /sys/fs/cgroup/cpu/mole_r1/cpu.cfs_period_us
echo 35000 > /sys/fs/cgroup/cpu/mole_r1/cpu.cfs_quota_us
"${MPI[@]}" -np 2 "$WRAP" "$MOLE" plan -m "$M" -t 1 -o "$(realpath "$OUT")/dist-plan.json" 2> "$OUT/dist-err.log" ||
  { cat "$OUT/dist-err.log" >&2; exit 1; }
# 128 generated tokens: a quota period is 100 ms, 32 tokens span only a few
TG=128 bench1 quota35 2 hmp-equal --parallel hmp
TG=128 bench1 quota35 2 hmp-planned --parallel hmp --plan "$(realpath "$OUT")/dist-plan.json"
# the same plan with the throttled rank spinning in its waits (as before it
# napped under a quota): the spin spends the quota its next block needs
MPI+=(-x MOLE_DIST_WAIT=spin)
TG=128 bench1 quota35 2 hmp-planned-spin --parallel hmp --plan "$(realpath "$OUT")/dist-plan.json"
MPI=("${MPI_SAVED[@]}")
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

python3 - "$runs" "$bytes" "$OUT/dist-mem.txt" << 'PY' | tee "$OUT/dist.txt"
import csv, os, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
print("latency per token (ms; mean of the runs):")
print("%-10s %2s %-12s %11s %11s" % ("link", "N", "mode", "prompt ms/t", "decode ms/t"))
for r in rows:
    print("%-10s %2s %-12s %11.2f %11.2f" % (r["link"], r["N"], r["mode"], 1e3 / float(r["pp_tps"]), 1e3 / float(r["tg_tps"])))
print("\nbytes sent per decode token by all ranks' interfaces (TCP/IP headers and ACKs included) vs the payload formula:")
print("%2s %-12s %12s %12s %6s %12s %12s" % ("N", "mode", "sent B/tok", "formula", "ratio", "sent B/layer", "formula"))
for r in csv.DictReader(open(sys.argv[2]), delimiter="\t"):
    print("%2s %-12s %12s %12s %6.3f %12s %12s" % (r["N"], r["mode"], r["sent_per_token"], r["formula_per_token"],
          float(r["sent_per_token"]) / float(r["formula_per_token"]), r["sent_per_layer"], r["formula_per_layer"]))
if os.path.exists(sys.argv[3]):
    print("\n" + open(sys.argv[3]).read().strip())
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
