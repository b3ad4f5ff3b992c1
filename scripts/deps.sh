#!/usr/bin/env bash
# Installs the Debian packages mole's build and tests need, when missing.
# Idempotent; prints nothing when everything is already there.
set -euo pipefail
pkgs=(build-essential cmake pkg-config clang libclang-rt-14-dev valgrind
      liburing-dev libopenblas-dev liblapacke-dev libpcre2-dev libcmocka-dev
      libcjson-dev libmicrohttpd-dev gnuplot-nox openmpi-bin libopenmpi-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
