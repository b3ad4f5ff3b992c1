# Shared by the tests/cli_*.sh scripts (sourced, not a test itself): the
# failure counter and check NAME WANT_RC NEEDLE -- cmd..., which runs cmd and
# fails unless it exits WANT_RC with NEEDLE in its stdout+stderr.
fails=0
fail() { echo "FAIL $*"; fails=$((fails + 1)); }
check() {
  local name=$1 want=$2 needle=$3
  shift 4
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" != "$want" ] || ! grep -qF -- "$needle" <<<"$out"; then
    echo "FAIL $name: rc=$rc (want $want), output lacks '$needle':"
    echo "$out" | head -5
    fails=$((fails + 1))
  fi
}

# stop_mpirun PID SIG: sends SIG to an mpirun (it forwards it to the ranks)
# and waits for it. Every rank must exit within 30 s (else a test failure);
# mpirun itself sometimes stays behind with all its ranks already exited
# (zombies it never reaps: Open MPI 4.1's launcher racing its own signal
# forwarding), and is then killed after 10 s more.
stop_mpirun() {
  local pid=$1 sig=$2 ranks alive
  ranks=$(pgrep -P "$pid" | tr '\n' ' ' || true)
  kill "-$sig" "$pid" 2> /dev/null || true
  alive=0
  for _ in $(seq 300); do
    alive=0
    kill -0 "$pid" 2> /dev/null || break
    for r in $ranks; do
      if [ -e "/proc/$r" ] && [ "$(awk '{print $3}' "/proc/$r/stat" 2> /dev/null)" != Z ]; then alive=1; fi
    done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  if [ "${alive:-0}" = 1 ]; then
    fail "mpirun $pid: a rank did not stop within 30 s of SIG$sig"
    kill -KILL "$pid" $ranks 2> /dev/null || true
  fi
  for _ in $(seq 100); do
    kill -0 "$pid" 2> /dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2> /dev/null; then
    echo "note: mpirun $pid outlived its exited ranks; killed"
    kill -KILL "$pid" 2> /dev/null || true
  fi
  wait "$pid" 2> /dev/null || true
}
