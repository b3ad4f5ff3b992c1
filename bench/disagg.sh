#!/usr/bin/env bash
# `make bench-disagg`: attention and experts on separate processes
# (--disagg, MegaScale-Infer) against co-located expert parallelism, at equal
# process counts (N = 2: one core each on this 2-core machine; N = 4: two
# processes per core), 16 sequences decoding together after a 256-token
# prompt each (mole bench --seqs): aggregate tokens/s, time per output token
# and the share of its pass each side sat idle waiting for the other
# (measured by the processes), for co-located (m = 1), disaggregated with the
# micro-batches one after another (m = 2) and ping-pong at m = 1..4; next to
# each, the throughput `mole plan --disagg` predicts from its profile, and the
# plan's own pick. Then the same at N = 2 with each process in its own
# network namespace, joined by veth links limited with tc tbf (1 Gbit/s,
# 100 Mbit/s), Open MPI over TCP (64-token prompts there). Needs root (netns, tc) for that part.
# Every run in bench/out/disagg-runs.tsv, the table in bench/out/disagg.txt,
# a plot in bench/out/disagg.png.
set -euo pipefail
cd "$(dirname "$0")/.."
MOLE=$(realpath "${MOLE:-build/mole}")
M=${DISAGG_MODEL:-models/bench/synth-r2-l8/synth-q4_0.gguf}
SEQS=${SEQS:-16}
PP=${PP:-256}
TG=${TG:-16}
REPS=${REPS:-3}
OUT=bench/out
mkdir -p "$OUT"
command -v mpirun > /dev/null || { echo "bench/disagg: needs mpirun: skipped" >&2; exit 0; }
if [ ! -f "$M" ]; then
  mkdir -p "$(dirname "$M")"
  "$MOLE" synth --arch mixtral --embd 1024 --layers 8 --experts 8 --used 2 --ff 3584 --vocab 32000 --type q4_0 \
    --seed 7 -o "$M.tmp" >&2
  mv "$M.tmp" "$M"
fi
M=$(realpath "$M")
OUTA=$(realpath "$OUT")
MPI=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,vader)
runs=$OUT/disagg-runs.tsv
printf "link\tN\tconfig\tflags\ttg_tps\ttpot_ms\tattn_idle\texpert_idle\tpredicted_tps\n" > "$runs"

# one configuration: link N label plan.json flags...
bench1() {
  local link=$1 n=$2 label=$3 plan=$4
  shift 4
  local j
  j=$("${MPI[@]}" -np "$n" "${WRAP[@]}" "$MOLE" bench -m "$M" --seqs "$SEQS" -p "$PP" -n "$TG" -r "$REPS" -t 1 --json \
    "$@" 2> "$OUT/disagg-err.log") || { cat "$OUT/disagg-err.log" >&2; return 1; }
  python3 - "$link" "$n" "$label" "$plan" "$j" "$*" >> "$runs" << 'PY'
import json, sys
link, n, label, plan, j, flags = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], json.loads(sys.argv[5]), sys.argv[6]
def idle(side):
    rs = [r for r in j["ranks"] if r[side]]
    return sum(r["wait_s"] / r["pass_s"] for r in rs) / len(rs) if rs else float("nan")
# the plan's prediction for these flags
f = flags.split()
coloc = "colocated" in f
mb = int(f[f.index("--micro-batches") + 1]) if "--micro-batches" in f else 2
pp = "--no-ping-pong" not in f
a = e = n
if not coloc:
    a, e = [int(x.split("=")[1]) for x in f[f.index("--disagg") + 1].split(",")]
pred = float("nan")
for c in json.load(open(plan))["candidates"]:
    if c["seqs"] == j["seqs"] and c["micro_batches"] == mb and c["attn"] == a and c["expert"] == e and \
       (coloc or c["ping_pong"] == pp):
        pred = c["tokens_per_s"]
pk = json.load(open(plan))["pick"]
if pk["seqs"] == j["seqs"] and pk["micro_batches"] == mb and pk["attn"] == a and pk["expert"] == e and \
   (coloc or pk["ping_pong"] == pp):
    label += " *"
print("%s\t%d\t%s\t%s\t%.2f\t%.3f\t%.3f\t%.3f\t%.2f" % (link, n, label, flags, j["tg_tps"], j["tpot_ms"], idle("attn"),
      idle("expert"), pred))
PY
  tail -n 1 "$runs" >&2
}

# the table's configurations at N processes, with the plan made for them
table() {  # link N
  local link=$1 n=$2 a e plan=$OUTA/disagg-plan-$1-$2.json
  "${MPI[@]}" -np "$n" "${WRAP[@]}" "$MOLE" plan --disagg -m "$M" --seqs "$SEQS" --ctx "$((PP + TG + 2))" -t 1 \
    -o "$plan" 2> "$OUT/disagg-err.log" || { cat "$OUT/disagg-err.log" >&2; return 1; }
  grep "mole plan" "$OUT/disagg-err.log" >&2
  a=$((n / 2))
  e=$((n - a))
  bench1 "$link" "$n" "co-located m=1" "$plan" --disagg colocated --micro-batches 1
  bench1 "$link" "$n" "disagg ${a}+${e} no ping-pong m=2" "$plan" --disagg "attn=$a,expert=$e" --micro-batches 2 --no-ping-pong
  for mb in 1 2 3 4; do
    bench1 "$link" "$n" "disagg ${a}+${e} ping-pong m=$mb" "$plan" --disagg "attn=$a,expert=$e" --micro-batches "$mb"
  done
  # the plan's pick, when it is none of the above
  local pick
  pick=$(python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))["pick"]
a, seqs = int(sys.argv[2]), int(sys.argv[3])
shown = p["seqs"] == seqs and ((p["colocated"] and p["micro_batches"] == 1) or
        (not p["colocated"] and p["attn"] == a and (p["ping_pong"] or p["micro_batches"] == 2)))
if not shown:
    f = "--disagg colocated" if p["colocated"] else "--disagg attn=%d,expert=%d" % (p["attn"], p["expert"])
    print("%s --micro-batches %d%s --seqs %d" % (f, p["micro_batches"], "" if p["ping_pong"] or p["colocated"] else " --no-ping-pong", p["seqs"]))
' "$plan" "$a" "$SEQS")
  [ -z "$pick" ] || bench1 "$link" "$n" "plan's pick (${pick#--disagg })" "$plan" $pick
}

WRAP=()
for n in 2 4; do table shm "$n"; done

# network namespaces over veth, rate-limited with tc
if [ "$(id -u)" -eq 0 ] && command -v tc > /dev/null; then
  NMAX=2
  NET=10.78.0
  teardown() {
    for r in $(seq 0 $((NMAX - 1))); do ip netns del "moledg_ns$r" 2> /dev/null || true; done
    ip link del moledg_br 2> /dev/null || true
  }
  trap teardown EXIT
  teardown
  ip link add moledg_br type bridge
  ip addr add $NET.254/24 dev moledg_br
  ip link set moledg_br up
  for r in $(seq 0 $((NMAX - 1))); do
    ip netns add "moledg_ns$r"
    ip link add "moledg_v$r" type veth peer name "moledg_p$r"
    ip link set "moledg_p$r" netns "moledg_ns$r"
    ip link set "moledg_v$r" master moledg_br
    ip link set "moledg_v$r" up
    ip netns exec "moledg_ns$r" ip addr add "$NET.$((r + 1))/24" dev "moledg_p$r"
    ip netns exec "moledg_ns$r" ip link set "moledg_p$r" up
    ip netns exec "moledg_ns$r" ip link set lo up
  done
  W=$OUT/disagg-rank.sh
  cat > "$W" << 'EOF'
#!/usr/bin/env bash
exec ip netns exec "moledg_ns$OMPI_COMM_WORLD_RANK" "$@"
EOF
  chmod +x "$W"
  WRAP=("$W")
  export PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include=$NET.0/24
  MPI=(mpirun --allow-run-as-root --oversubscribe --bind-to none -x PMIX_MCA_ptl_tcp_remote_connections
       -x PMIX_MCA_ptl_tcp_if_include --mca btl tcp,self --mca btl_tcp_if_include $NET.0/24
       --mca oob_tcp_if_include $NET.0/24)
  for link in 1gbit 100mbit; do
    for r in $(seq 0 $((NMAX - 1))); do
      ip netns exec "moledg_ns$r" tc qdisc del dev "moledg_p$r" root 2> /dev/null || true
      ip netns exec "moledg_ns$r" tc qdisc add dev "moledg_p$r" root tbf rate "$link" burst 256kb latency 200ms
    done
    # prompts cross the slow link too (untimed): shorter ones there
    PP=${NET_PP:-64} REPS=${NET_REPS:-2} table "$link" 2
  done
else
  echo "bench/disagg: not root or no tc: the network-namespace part skipped" >&2
fi

python3 - "$runs" << 'PY' | tee "$OUT/disagg.txt"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
print("sequences decoding together (16 unless the plan's pick says otherwise); tokens/s in all, ms per output token,")
print("idle share of each side's pass (waiting for the other side, and for logits to reach rank 0);")
print("predicted: mole plan --disagg's model for the same flags (its pick marked *)")
print("%-8s %2s %-34s %9s %8s %9s %11s %10s %7s" % ("link", "N", "configuration", "tokens/s", "ms/token", "attn idle",
      "expert idle", "predicted", "pred/meas"))
for r in rows:
    pr = float(r["predicted_tps"])
    print("%-8s %2s %-34s %9.1f %8.2f %8.1f%% %10.1f%% %10.1f %7.2f" % (r["link"], r["N"], r["config"], float(r["tg_tps"]),
          float(r["tpot_ms"]), 100 * float(r["attn_idle"]), 100 * float(r["expert_idle"]), pr, pr / float(r["tg_tps"])))
PY
if command -v gnuplot > /dev/null; then
  python3 - "$runs" > "$OUT/disagg-plot.dat" << 'PY'
import csv, sys
for i, r in enumerate(csv.DictReader(open(sys.argv[1]), delimiter="\t")):
    print(i, '"%s N=%s %s"' % (r["link"], r["N"], r["config"]), r["tg_tps"], r["predicted_tps"])
PY
  gnuplot << 'GP'
set terminal pngcairo size 1200,520
set output "bench/out/disagg.png"
set style data histograms
set style fill solid 0.8
set ylabel "tokens/s (16 sequences)"
set xtics rotate by -45 font ",8"
set key top right
plot "bench/out/disagg-plot.dat" using 3:xtic(2) title "measured", "" using 4 title "predicted by mole plan --disagg"
GP
fi
