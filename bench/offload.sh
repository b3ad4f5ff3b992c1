#!/usr/bin/env bash
# Expert offloading benchmark (issue 4), in one run:
#  - a Mixtral-shaped ~0.8B model in Q8_0 (803 MiB), packed with Q8_0 high and
#    Q4_0 low copies;
#  - raw O_DIRECT read bandwidth of the disk (dd), measured in the same run;
#  - under cgroup v1 memory limits of 1/2 and 1/4 of the model's size:
#    llama.cpp (when LLAMA_CPP_DIR is set) on the plain GGUF, and mole for each
#    cache policy (high precision only, no prefetch), with prefetch, and the
#    full HOBBIT configuration (policy hobbit + prefetch + mixed precision);
#  - quality of mixed precision (KL divergence, top-1 agreement over
#    KLD_POSITIONS generated positions) for several (T1, T2);
#  - every configuration PASSES times (in order, then reversed: the disk drifts);
#    a table of the means (bench/out/offload.tsv) and PNG plots (bench/out/*.png, gnuplot).
# MODEL=path/to/model.gguf runs the same on a trained MoE GGUF instead of the
# synthesized one, with every output named after it (bench/out/offload-NAME*.tsv,
# offload-NAME-*.png; the packed copy in models/bench/NAME-packed.gguf). A small
# model's experts are a small part of what a process needs, so 1/2 or 1/4 of the
# file would be below the binary, libraries, buffers and page cache alone: the
# limits are a measured per-process baseline (the larger of mole's and
# llama-bench's peak RSS, each less the expert bytes it held) plus 1/2 and
# 1/4 of the expert bytes, and mole's --expert-budget is that share, so each
# configuration holds only that share of the experts in RAM and reads the rest
# from disk. BASE_MIB=N skips the measurement; LIMITS_MIB="A B" sets the limits.
# MOLE_BUDGET=auto|512MiB|40%|... overrides mole's --expert-budget in every run
# (default: the share above with MODEL; unset, i.e. mole's auto, without).
# "stalled GB/s": bytes the disk delivered while the forward pass waited for
# reads / that time; "busy GB/s": bytes read / the time reads were in flight
# (completions are noticed when reaped, so it errs low).
# LOW=TYPE|FILE: the low-precision copies (default q4_0): a type, or a compressed
# model of MODEL (mole compress) whose experts become the low tier; outputs are
# tagged with it. ONLY="name ...": run only these configurations (names below).
# Needs root for the cgroups (without it, runs unconstrained and says so).
set -euo pipefail
cd "$(dirname "$0")/.."
MOLE=${MOLE:-build/mole}
THREADS=${THREADS:-2}
NGEN=${NGEN:-128}
KLD_POSITIONS=${KLD_POSITIONS:-2000}
OUT=bench/out
if [ -n "${MODEL:-}" ]; then
  [ -f "$MODEL" ] || { echo "offload: MODEL=$MODEL: no such file" >&2; exit 1; }
  NAME=$(basename "$MODEL" .gguf)
  LOW=${LOW:-q4_0}
  LOWTAG=$([ -f "$LOW" ] && basename "$LOW" .gguf || echo "$LOW")
  TAG=-$NAME$([ "$LOW" = q4_0 ] || echo "-low-$LOWTAG")  # in every output's name, so the synthesized model's stay
  MODELS=models/bench
  mkdir -p "$MODELS" "$OUT"
  SRC=$MODEL
  PACKED=$MODELS/$NAME-packed$([ "$LOW" = q4_0 ] || echo "-low-$LOWTAG").gguf
  # repacked when the model (or the low file) is newer (a checkpoint replaced under the same name)
  if [ ! "$PACKED" -nt "$SRC" ] || { [ -f "$LOW" ] && [ ! "$PACKED" -nt "$LOW" ]; }; then
    "$MOLE" pack "$SRC" -o "$PACKED" --high q8_0 --low "$LOW" -t "$THREADS" >&2
  fi
else
  TAG=""
  # the models depend on synth's revision (r2: larger token embeddings, see synth.c)
  MODELS=models/bench/synth-r2
  mkdir -p "$MODELS" "$OUT"
  SRC=$MODELS/mixtral-0.8b-q8_0.gguf
  PACKED=$MODELS/mixtral-0.8b-q8_0-q4_0-packed.gguf
  [ -f "$SRC" ] || "$MOLE" synth --arch mixtral --embd 1024 --layers 8 --experts 8 --used 2 --ff 3584 --vocab 32000 \
    --type q8_0 --seed 7 -o "$SRC" >&2
  [ -f "$PACKED" ] || "$MOLE" pack "$SRC" -o "$PACKED" --high q8_0 --low q4_0 -t "$THREADS" >&2
fi
SIZE=$(stat -c %s "$SRC")
if [ -n "${MODEL:-}" ]; then RUN_TIMEOUT=${RUN_TIMEOUT-600}; else RUN_TIMEOUT=${RUN_TIMEOUT-}; fi

LLAMA_BENCH=""
if [ -n "${LLAMA_CPP_DIR:-}" ]; then
  for c in "$LLAMA_CPP_DIR/build/bin/llama-bench" "$LLAMA_CPP_DIR/bin/llama-bench"; do
    [ -x "$c" ] && LLAMA_BENCH=$c && break
  done
fi

CG_ROOT=/sys/fs/cgroup/memory
CG=$CG_ROOT/mole-bench-$$
use_cg=1
if [ "$(id -u)" != 0 ] || [ ! -w "$CG_ROOT" ]; then
  use_cg=0
  echo "offload: no writable cgroup v1 memory controller: running WITHOUT memory limits" >&2
fi
cleanup() { [ -d "$CG" ] && { while read -r p; do echo "$p" >"$CG_ROOT/cgroup.procs"; done <"$CG/cgroup.procs"; rmdir "$CG"; } 2>/dev/null; true; }
trap cleanup EXIT

drop_cache() {  # the model must come from the disk, not from pages cached earlier
  sync
  [ "$(id -u)" = 0 ] && echo 1 >/proc/sys/vm/drop_caches 2>/dev/null || true
}

# in_cgroup LIMIT_BYTES cmd... : runs cmd in a fresh cgroup; its peak memory
# and OOM kills go to $OUT/.cg$TAG (callers capture stdout in a subshell)
in_cgroup() {
  local limit=$1
  shift
  # a process thrashing far under its limit need not end: RUN_TIMEOUT=SECONDS
  # ends it (a FAIL row; the default with MODEL is 600, none without)
  [ -n "$RUN_TIMEOUT" ] && set -- timeout -k 5 "$RUN_TIMEOUT" "$@"
  drop_cache
  if [ $use_cg = 0 ]; then
    echo "0 0" >"$OUT/.cg$TAG"
    "$@"
    return
  fi
  mkdir "$CG"
  echo "$limit" >"$CG/memory.limit_in_bytes"
  local rc=0
  bash -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' _ "$CG" "$@" || rc=$?
  echo "$(cat "$CG/memory.max_usage_in_bytes") $(awk '$1 == "oom_kill" {print $2}' "$CG/memory.oom_control")" >"$OUT/.cg$TAG"
  rmdir "$CG"
  return $rc
}
cg_result() { read -r PEAK OOM <"$OUT/.cg$TAG"; }

# the disk's raw O_DIRECT rate, one stream of 16 MiB reads; it drifts, so it
# is measured before each memory limit's runs and after the last
RAW_ALL=""
raw_bw() {
  drop_cache
  local g
  g=$(dd if="$PACKED" of=/dev/null bs=16M count=48 iflag=direct 2>&1 | awk '/copied/ {printf "%.3f", $1 / $(NF-3) / 1e9}')
  RAW_ALL="$RAW_ALL $g"
  echo "raw O_DIRECT read bandwidth: $g GB/s"
}

TSV=$OUT/offload$TAG.tsv
RUNS=$OUT/offload$TAG-runs.tsv  # every run; offload$TAG.tsv has the mean over the passes
printf "limit_mib\tconfig\tpass\ttg_tps\thit_rate\tmib_per_token\tstall_gbps\tdisk_gbps\tpeak_mib\toom\n" >"$RUNS"
run_row() {  # limit config pass tps hit mib_per_token stall_gbps disk_gbps peak oom
  printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n" "$@" >>"$RUNS"
  printf "%-6s %-26s pass %s %8s t/s  hit %-6s  %8s MiB/tok  stalled %5s GB/s  busy %5s GB/s  peak %5s MiB  oom %s\n" "$@"
}

LLAMA_NGEN=${LLAMA_NGEN:-$([ -n "${MODEL:-}" ] && echo "$NGEN" || echo 16)}
llama_cfg() {  # llama_cfg LIMIT PASS
  local limit=$1 pass=$2 j tps rc=0
  j=$(in_cgroup "$limit" "$LLAMA_BENCH" -m "$SRC" -p 0 -n "$LLAMA_NGEN" -r 1 -t "$THREADS" -o json 2>"$OUT/.llama$TAG.err") || { rc=$?; j="[]"; }
  cg_result
  tps=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1] or "[]"); print("%.2f"%d[0]["avg_ts"] if d else "FAIL")' "$j")
  run_row $((limit >> 20)) llama.cpp "$pass" "$tps" - - - - $((PEAK >> 20)) "${OOM:-0}"
  # a llama.cpp that cannot run under the limit is a result: say why
  [ "$tps" = FAIL ] && echo "llama.cpp FAILED under $((limit >> 20)) MiB (exit $rc, 124: past RUN_TIMEOUT; oom kills ${OOM:-0}): $(tail -n 2 "$OUT/.llama$TAG.err" | tr '\n' ' ')"
  true
}

mole_cfg() {  # mole_cfg LIMIT PASS NAME flags...
  local limit=$1 pass=$2 name=$3
  shift 3
  local j
  j=$(in_cgroup "$limit" "$MOLE" bench -m "$PACKED" -p 0 -n "$NGEN" -r 1 -t "$THREADS" --json "${BUDGET_ARGS[@]}" "$@") || { cg_result; run_row $((limit >> 20)) "$name" "$pass" FAIL - - - - $((PEAK >> 20)) "${OOM:-0}"; return; }
  cg_result
  echo "$j" >"$OUT/offload$TAG-$((limit >> 20))-$name-$pass.json"
  read -r tps hit mpt sgb dgb < <(python3 -c '
import json,sys; d=json.loads(sys.argv[1]); o=d["offload"]
print("%.2f"%d["tg_tps"], "%.3f"%o.get("hit_rate",1), "%.1f"%(o.get("bytes_per_token",0)/1048576), "%.2f"%o.get("stall_gbps",-1), "%.2f"%o.get("disk_gbps",-1))' "$j")
  run_row $((limit >> 20)) "$name" "$pass" "$tps" "$hit" "$mpt" "$sgb" "$dgb" $((PEAK >> 20)) "${OOM:-0}"
}

# full HOBBIT: the second expert of a token in low precision unless the two
# weigh about the same (t1 0.5), skipped when it weighs under 1/9 of the pair
MIXED="--t1 0.5 --t2 0.9"
CONFIGS=(
  "lru|--cache-policy lru --prefetch-depth 0"
  "lfu|--cache-policy lfu --prefetch-depth 0"
  "lhu|--cache-policy lhu --prefetch-depth 0"
  "fld|--cache-policy fld --prefetch-depth 0"
  "hobbit|--cache-policy hobbit --prefetch-depth 0"
  "hobbit+prefetch|--cache-policy hobbit --prefetch-depth -1"
  "hobbit+mixed|--cache-policy hobbit --prefetch-depth 0 $MIXED"
  "hobbit+prefetch+mixed|--cache-policy hobbit --prefetch-depth -1 $MIXED"
)
if [ -n "${ONLY:-}" ]; then
  keep=()
  for c in "${CONFIGS[@]}"; do
    for o in $ONLY; do [ "${c%%|*}" = "$o" ] && keep+=("$c"); done
  done
  [ ${#keep[@]} -gt 0 ] || { echo "offload: ONLY='$ONLY' names no configuration" >&2; exit 1; }
  CONFIGS=("${keep[@]}")
fi
# The disk of a cloud VM drifts over minutes: every configuration runs PASSES
# times, in order then in reverse order, so drift does not favour the
# configurations that come first; the table has the means.
PASSES=${PASSES:-2}
# the limits, with what mole's --expert-budget is under each (BUDGETS, "" = no flag: auto)
LIMITS=() BUDGETS=() WHY=()
if [ -z "${MODEL:-}" ]; then
  for frac in 2 4; do
    LIMITS+=($((SIZE / frac))) BUDGETS+=("${MOLE_BUDGET:-}") WHY+=("1/$frac of the $((SIZE >> 20)) MiB model")
  done
else
  # expert bytes: mole's high-precision copies (what its cache holds), the
  # source's expert tensors (what llama.cpp maps); K experts per token
  sum_tensors() { "$MOLE" inspect "$1" | awk -v re="$2" '$2 ~ re {s += $NF} END {printf "%d\n", s}'; }
  max_tensor() { "$MOLE" inspect "$1" | awk -v re="$2" '$2 ~ re && $NF > m {m = $NF} END {printf "%d\n", m}'; }
  EXP=$(sum_tensors "$PACKED" '^blk\.[0-9]+\.ffn_exps\.[0-9]+\.high$')
  EXP_SRC=$(sum_tensors "$SRC" '(_exps\.weight|\.ffn_(gate|up|down)\.[0-9]+\.weight)$')
  K=$("$MOLE" inspect "$PACKED" | awk '$1 ~ /\.expert_used_count$/ && !k {k = $3} END {print k}')
  [ "$EXP" -gt 0 ] && [ "$EXP_SRC" -gt 0 ] && [ -n "$K" ] || { echo "offload: $MODEL: no experts found (not a MoE model?)" >&2; exit 1; }
  echo "== $NAME: $((SIZE >> 10)) KiB; experts $((EXP >> 10)) KiB in mole's high copies, $((EXP_SRC >> 10)) KiB in the source; $K per token"
  if [ -n "${BASE_MIB:-}" ]; then
    BASE=$((BASE_MIB << 20))
    echo "per-process baseline: $BASE_MIB MiB (BASE_MIB)"
  elif [ $use_cg = 0 ]; then
    BASE=0
    echo "per-process baseline: not measured (no cgroup: the limits are not applied; mole's budgets are the shares)"
  else
    # what a process needs besides its share of the experts, measured without
    # a limit as peak RSS (binary and libraries mapped, non-expert weights,
    # KV, buffers; page cache beyond that is reclaimed under a limit, so the
    # cgroup's peak, shown too, overstates the need) less the expert bytes it
    # held: mole with the least cache a token needs (K experts in each
    # precision), and llama-bench, which maps (touches) every expert
    peak_rss() {  # peak_rss cmd... : RSS=child's peak RSS in bytes, PEAK from the cgroup
      RSS=$(in_cgroup -1 python3 -c '
import resource,subprocess,sys
rc=subprocess.run(sys.argv[1:],stdout=subprocess.DEVNULL,stderr=subprocess.DEVNULL).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss*1024); sys.exit(rc)' "$@") || return 1
      cg_result
    }
    B0=$((K * ($(max_tensor "$PACKED" '\.high$') + $(max_tensor "$PACKED" '\.low$'))))
    # shellcheck disable=SC2086
    peak_rss "$MOLE" bench -m "$PACKED" -p 0 -n "$NGEN" -r 1 -t "$THREADS" --json --expert-budget "$B0" \
      --cache-policy hobbit --prefetch-depth -1 $MIXED || { echo "offload: mole failed without a limit" >&2; exit 1; }
    BASE_MOLE=$((RSS - B0))
    BASE=$BASE_MOLE
    msg="mole: peak RSS $((RSS >> 10)) KiB (cgroup $((PEAK >> 10)) KiB) with a $((B0 >> 10)) KiB expert cache -> $((BASE_MOLE >> 10)) KiB"
    if [ -n "$LLAMA_BENCH" ]; then
      if peak_rss "$LLAMA_BENCH" -m "$SRC" -p 0 -n "$LLAMA_NGEN" -r 1 -t "$THREADS" -o json; then
        BASE_LLAMA=$((RSS - EXP_SRC))
        [ $BASE_LLAMA -gt $BASE ] && BASE=$BASE_LLAMA
        msg="$msg; llama-bench: peak RSS $((RSS >> 10)) KiB (cgroup $((PEAK >> 10)) KiB) -> $((BASE_LLAMA >> 10)) KiB"
      else
        msg="$msg; llama-bench FAILED without a limit"
      fi
    fi
    BASE=$(((BASE + (1 << 20) - 1) >> 20 << 20))
    echo "per-process baseline $((BASE >> 20)) MiB ($msg)"
  fi
  if [ -n "${LIMITS_MIB:-}" ]; then
    for l in $LIMITS_MIB; do
      LIMITS+=($((l << 20))) WHY+=("LIMITS_MIB: baseline $((BASE >> 20)) MiB + $(((l << 20) - BASE >> 10)) KiB")
      BUDGETS+=("${MOLE_BUDGET:-$(((l << 20) - BASE > 0 ? (l << 20) - BASE : 0))}")
    done
  else
    for frac in 2 4; do
      share=$((EXP / frac))
      LIMITS+=($(((BASE + share + (1 << 20) - 1) >> 20 << 20))) BUDGETS+=("${MOLE_BUDGET:-$share}")
      WHY+=("baseline $((BASE >> 20)) MiB + 1/$frac of the $((EXP >> 10)) KiB of experts")
    done
  fi
  # a share of 0 (a limit at or under the baseline): mole's auto, the least a token needs
  for i in "${!BUDGETS[@]}"; do if [ "${BUDGETS[i]}" = 0 ]; then BUDGETS[i]=auto; fi; done
fi
for li in "${!LIMITS[@]}"; do
  LIMIT=${LIMITS[$li]}
  BUDGET_ARGS=()
  [ -n "${BUDGETS[$li]}" ] && BUDGET_ARGS=(--expert-budget "${BUDGETS[$li]}")
  echo "== memory limit $((LIMIT >> 20)) MiB (${WHY[$li]})${BUDGET_ARGS[*]:+; mole ${BUDGET_ARGS[*]}}"
  raw_bw
  for pass in $(seq 1 "$PASSES"); do
    order=("${CONFIGS[@]}")
    if [ $((pass % 2)) = 0 ]; then
      order=()
      for ((i = ${#CONFIGS[@]} - 1; i >= 0; i--)); do order+=("${CONFIGS[$i]}"); done
    fi
    [ -n "$LLAMA_BENCH" ] && [ $((pass % 2)) = 1 ] && llama_cfg "$LIMIT" "$pass"
    for c in "${order[@]}"; do
      # shellcheck disable=SC2086
      mole_cfg "$LIMIT" "$pass" "${c%%|*}" ${c#*|}
    done
    [ -n "$LLAMA_BENCH" ] && [ $((pass % 2)) = 0 ] && llama_cfg "$LIMIT" "$pass"
  done
done
raw_bw
RAW_GBS=$(python3 -c 'import sys; v=[float(x) for x in sys.argv[1:]]; print("%.3f"%(sum(v)/len(v)))' $RAW_ALL)
echo "raw O_DIRECT read bandwidth: mean $RAW_GBS GB/s of$RAW_ALL"
python3 - "$RUNS" "$TSV" <<'PY'
import csv,sys
rows=list(csv.DictReader(open(sys.argv[1]),delimiter="\t"))
out=open(sys.argv[2],"w")
cols=["limit_mib","config","tg_tps","hit_rate","mib_per_token","stall_gbps","disk_gbps","peak_mib","oom"]
out.write("\t".join(cols)+"\n")
print("== means over the passes")
seen=[]
for r in rows:
    k=(r["limit_mib"],r["config"])
    if k not in seen: seen.append(k)
for k in seen:
    g=[r for r in rows if (r["limit_mib"],r["config"])==k]
    def mean(c):
        v=[float(r[c]) for r in g if r[c] not in ("-","FAIL")]
        return ("%.3f"%(sum(v)/len(v)) if c=="hit_rate" else "%.2f"%(sum(v)/len(v))) if v else ("FAIL" if any(r[c]=="FAIL" for r in g) else "-")
    vals=[k[0],k[1],mean("tg_tps"),mean("hit_rate"),mean("mib_per_token"),mean("stall_gbps"),mean("disk_gbps"),str(max(int(r["peak_mib"]) for r in g)),str(max(int(r["oom"] or 0) for r in g))]
    out.write("\t".join(vals)+"\n")
    print("%-6s %-26s %8s t/s (%s)  hit %-6s  %8s MiB/tok  stalled %5s GB/s  busy %5s GB/s  peak %5s MiB  oom %s"%(vals[0],vals[1],vals[2]," ".join(r["tg_tps"] for r in g),vals[3],vals[4],vals[5],vals[6],vals[7],vals[8]))
PY

echo "== quality of mixed precision ($KLD_POSITIONS positions, against high precision)"
KT=$OUT/offload$TAG-kld.tsv
printf "t1\tt2\tkld_mean\ttop1\n" >"$KT"
for tt in "1 1" "0.6 0.9" "0.5 0.9" "0.5 0.75" "0.5 0.5"; do
  set -- $tt
  j=$("$MOLE" kld -m "$PACKED" --expert-budget 0 --t1 "$1" --t2 "$2" -n "$KLD_POSITIONS" -t "$THREADS" --json)
  python3 -c 'import json,sys; d=json.loads(sys.argv[3]); print("%s\t%s\t%.5f\t%.4f"%(sys.argv[1],sys.argv[2],d["kld_mean"],d["top1_agreement"]))' "$1" "$2" "$j" | tee -a "$KT"
done

if [ -z "${MODEL:-}" ]; then
  # for scale: the whole model in Q4_0 (same random weights) against Q8_0
  Q4=$MODELS/mixtral-0.8b-q4_0.gguf
  [ -f "$Q4" ] || "$MOLE" synth --arch mixtral --embd 1024 --layers 8 --experts 8 --used 2 --ff 3584 --vocab 32000 \
    --type q4_0 --seed 7 -o "$Q4" >&2
  j=$("$MOLE" kld -m "$Q4" --ref "$SRC" --expert-budget 0 -n "$KLD_POSITIONS" -t "$THREADS" --json)
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("all-q4_0\t-\t%.5f\t%.4f"%(d["kld_mean"],d["top1_agreement"]))' "$j" | tee -a "$KT"
else
  # for scale: every expert in Q4_0 (packed with Q4_0 high copies), against
  # the same reference as the rows above (the packed model's Q8_0 copies)
  Q4=$MODELS/$NAME-experts-q4_0-packed.gguf
  [ "$Q4" -nt "$SRC" ] || "$MOLE" pack "$SRC" -o "$Q4" --high q4_0 -t "$THREADS" >&2
  j=$("$MOLE" kld -m "$Q4" --ref "$PACKED" --expert-budget 0 -n "$KLD_POSITIONS" -t "$THREADS" --json)
  python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print("experts-q4_0\t-\t%.5f\t%.4f"%(d["kld_mean"],d["top1_agreement"]))' "$j" | tee -a "$KT"
fi

python3 - "$TSV" "$RAW_GBS" <<'PY'
import csv,sys
rows=list(csv.DictReader(open(sys.argv[1]),delimiter="\t")); raw=float(sys.argv[2])
for lim in sorted({r["limit_mib"] for r in rows}, key=int, reverse=True):
    g={r["config"]:r for r in rows if r["limit_mib"]==lim}
    f=lambda k: float(g[k]["tg_tps"]) if k in g and g[k]["tg_tps"] not in ("FAIL","-") else None
    full,lru,ll=f("hobbit+prefetch+mixed"),f("lru"),f("llama.cpp")
    print(f"limit {lim} MiB:", end=" ")
    if full and ll: print(f"full HOBBIT / llama.cpp = {full/ll:.1f}x (target >= 10x);", end=" ")
    if full and lru: print(f"full HOBBIT / high-only LRU = {full/lru:.2f}x (target >= 1.5x);", end=" ")
    s=[float(r["stall_gbps"]) for r in g.values() if r["stall_gbps"] not in ("-","FAIL") and float(r["stall_gbps"])>0]
    if s: print(f"disk while stalled on misses: {min(s):.2f}-{max(s):.2f} GB/s = {100*min(s)/raw:.0f}-{100*max(s)/raw:.0f}% of raw O_DIRECT {raw:.2f} GB/s (target >= 80%)", end="")
    print()
    # every configuration against llama.cpp and against high-only LRU
    if "llama.cpp" in g and not ll:
        print(f"  llama.cpp could not run under {lim} MiB (tg {g['llama.cpp']['tg_tps']}, oom kills {g['llama.cpp']['oom']})")
    print("  %-24s %9s %11s %7s %7s %9s %9s" % ("config", "t/s", "/llama.cpp", "/lru", "hit", "MiB/tok", "peak MiB"))
    for c, r in g.items():
        t = f(c)
        ratio = lambda b: "%.2fx" % (t / b) if t and b else "-"
        print("  %-24s %9s %11s %7s %7s %9s %9s" % (c, r["tg_tps"], ratio(ll), ratio(lru), r["hit_rate"], r["mib_per_token"], r["peak_mib"]))
PY

if command -v gnuplot >/dev/null; then
  python3 - "$TSV" "$OUT/offload$TAG" <<'PY'
import csv,sys
rows=list(csv.DictReader(open(sys.argv[1]),delimiter="\t")); out=sys.argv[2]
cfgs=[c for c in dict.fromkeys(r["config"] for r in rows)]
lims=sorted({int(r["limit_mib"]) for r in rows})
with open(out+"-tps.dat","w") as f:
    f.write("limit "+" ".join('"%s"'%c for c in cfgs)+"\n")
    for l in lims:
        g={r["config"]:r for r in rows if int(r["limit_mib"])==l}
        f.write(str(l)+" "+" ".join(g[c]["tg_tps"] if c in g and g[c]["tg_tps"] not in("FAIL","-") else "?" for c in cfgs)+"\n")
for key,name in (("mib_per_token","bytes"),("hit_rate","hits")):
    with open(out+"-%s.dat"%name,"w") as f:
        f.write("config "+" ".join('"%d MiB"'%l for l in lims)+"\n")
        for c in cfgs:
            if c=="llama.cpp": continue
            f.write('"%s" '%c+" ".join(next((r[key] for r in rows if r["config"]==c and int(r["limit_mib"])==l),"?") for l in lims)+"\n")
n=len(cfgs)
open(out+".gp","w").write(f"""set terminal png size 900,540
set datafile missing "?"
set key outside right
set output "{out}-tps.png"
set title "generation speed vs memory limit (log scale)"
set xlabel "memory limit (MiB)"; set ylabel "tokens/s"; set logscale y
plot for [i=2:{n+1}] "{out}-tps.dat" using 1:i with linespoints title columnhead(i)
unset logscale y
set style data histograms; set style fill solid 0.8; set xtics rotate by -30
set output "{out}-bytes.png"
set title "expert bytes read per token"; set xlabel ""; set ylabel "MiB / token"
plot for [i=2:{len(lims)+1}] "{out}-bytes.dat" using i:xtic(1) title columnhead(i)
set output "{out}-hits.png"
set title "expert cache hit rate per configuration"; set ylabel "hit rate"; set yrange [0:1]
plot for [i=2:{len(lims)+1}] "{out}-hits.dat" using i:xtic(1) title columnhead(i)
""")
PY
  if gnuplot "$OUT/offload$TAG.gp"; then echo "plots: $OUT/offload$TAG-tps.png $OUT/offload$TAG-bytes.png $OUT/offload$TAG-hits.png"; fi
fi
