#!/usr/bin/env bash
# A model twice the size of a cgroup v1 memory limit runs inside it: the
# expert budget (auto, then explicit) keeps the process under the limit, it
# is never OOM-killed, and it generates the same tokens as an unconstrained
# resident run. Skips (exit 0, "skipped: ...") without a writable cgroup v1
# memory controller (not root, cgroup v2 only) and under ASan (its shadow
# memory does not fit such limits).
set -uo pipefail
M=${MOLE_BIN:?}
CG_ROOT=/sys/fs/cgroup/memory
if [ "${MOLE_ASAN:-0}" = 1 ]; then echo "skipped: ASan build"; exit 0; fi
if [ "$(id -u)" != 0 ] || [ ! -w "$CG_ROOT" ] || [ ! -e "$CG_ROOT/memory.limit_in_bytes" ]; then
  echo "skipped: no writable cgroup v1 memory controller at $CG_ROOT (needs root)"
  exit 0
fi
T=$(mktemp -d)
CG=$CG_ROOT/mole-test-$$
cleanup() {
  if [ -d "$CG" ]; then
    # move anything left back to the root, then remove the group
    while read -r p; do echo "$p" >"$CG_ROOT/cgroup.procs" 2>/dev/null; done <"$CG/cgroup.procs"
    rmdir "$CG" 2>/dev/null
  fi
  rm -rf "$T"
}
trap cleanup EXIT
fails=0

# ~106 MB, ~104 MB of it experts (8 layers x 16 experts of 0.8 MB)
"$M" synth --arch mixtral --embd 256 --layers 8 --experts 16 --used 2 --ff 1024 --type q8_0 --vocab 1000 --ctx 256 \
  -o "$T/m.gguf" >/dev/null 2>&1 || { echo "FAIL synth"; exit 1; }
size=$(stat -c %s "$T/m.gguf")
limit=$((size / 2))
ARGS=(run -m "$T/m.gguf" --tokens 1,2,3,4,5,6,7,8 -n 24 --ids --temp 0 -c 128 -b 16 -t 2)
want=$("$M" "${ARGS[@]}" --expert-budget 0 2>/dev/null) || { echo "FAIL resident run"; exit 1; }
sync "$T/m.gguf"

run_limited() {  # run_limited NAME EXTRA_FLAGS...
  local name=$1
  shift
  # the model's pages must not sit in the page cache, charged elsewhere
  dd if="$T/m.gguf" iflag=nocache count=0 status=none 2>/dev/null
  mkdir "$CG" || { echo "FAIL $name: cannot create $CG"; fails=$((fails + 1)); return; }
  echo "$limit" >"$CG/memory.limit_in_bytes"
  local out rc
  out=$(bash -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' _ "$CG" "$M" "${ARGS[@]}" --stats "$@" 2>"$T/err")
  rc=$?
  local peak failcnt oom cache
  peak=$(cat "$CG/memory.max_usage_in_bytes")
  cache=$(awk '$1 == "cache" {print $2}' "$CG/memory.stat")
  failcnt=$(cat "$CG/memory.failcnt")
  oom=$(awk '$1 == "oom_kill" {print $2}' "$CG/memory.oom_control")
  rmdir "$CG"
  echo "$name: limit $((limit >> 20)) MiB (model $((size >> 20)) MiB), peak $((peak >> 20)) MiB (page cache at exit $((cache >> 20)) MiB), failcnt $failcnt, oom kills ${oom:-0}"
  grep "experts: tiered" "$T/err" | head -1
  if [ "$rc" != 0 ]; then
    echo "FAIL $name: exit code $rc"
    head -5 "$T/err"
    fails=$((fails + 1))
  fi
  [ "${oom:-0}" = 0 ] || { echo "FAIL $name: OOM-killed"; fails=$((fails + 1)); }
  [ "$peak" -le "$limit" ] || { echo "FAIL $name: peak $peak > limit $limit"; fails=$((fails + 1)); }
  # the kernel caps usage at the limit by reclaiming (failcnt counts each
  # time it had to): mole's budget must leave it nothing to reclaim
  [ "$failcnt" = 0 ] || { echo "FAIL $name: the cgroup hit its limit $failcnt times"; fails=$((fails + 1)); }
  grep -q "experts: tiered" "$T/err" || { echo "FAIL $name: not tiered"; fails=$((fails + 1)); }
  [ "$out" = "$want" ] || { echo "FAIL $name: tokens '$out' != resident '$want'"; fails=$((fails + 1)); }
}
run_limited auto                       # the budget comes from the cgroup limit
run_limited explicit --expert-budget $((limit / 4))

if [ $fails -ne 0 ]; then
  echo "cli_offload_cgroup: $fails failed"
  exit 1
fi
echo "cli_offload_cgroup: ok"
