#!/usr/bin/env bash
# Installs what the aarch64 cross build and its tests under qemu need (make
# test-arm64): Debian's cross compiler, qemu-user, and the arm64 -dev
# packages of mole's libraries through multiarch. Open MPI is left out (its
# arm64 package cannot be installed beside the host's): that build is
# configured with -DMOLE_MPI=OFF. Idempotent; prints nothing when all is there.
set -euo pipefail
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
pkgs=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libc6:arm64
      libopenblas-dev:arm64 liblapacke-dev:arm64 libpcre2-dev:arm64 libcmocka-dev:arm64
      libcjson-dev:arm64 libmicrohttpd-dev:arm64 liburing-dev:arm64)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "deps-arm64: installing ${missing[*]}"
if ! dpkg --print-foreign-architectures | grep -qx arm64; then
  $SUDO dpkg --add-architecture arm64
fi
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
