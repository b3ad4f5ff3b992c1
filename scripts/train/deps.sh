#!/usr/bin/env bash
# Debian packages for `make eval-model` only (the engine, make run and make test need none of them):
# PyTorch and friends for the trainer, and the packages whose text is the corpus.
set -euo pipefail
pkgs=(python3-torch python3-numpy python3-regex python3-matplotlib dict-gcide wordnet-base fortunes fortunes-min)
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "eval-model: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
