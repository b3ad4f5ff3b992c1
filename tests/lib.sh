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
