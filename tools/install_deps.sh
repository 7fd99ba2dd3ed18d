#!/usr/bin/env bash
# Installs every build and test dependency of lns from Debian packages.
# Idempotent: packages already present are not downloaded again, and
# `apt-get update` runs only when something is missing.
set -euo pipefail

PKGS=(cmake g++ make ccache pkg-config
      libopenmpi-dev openmpi-bin
      libgoogle-glog-dev libgflags-dev libabsl-dev
      libopenblas-dev libgtest-dev nlohmann-json3-dev
      python3 fortunes fortunes-min)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "[install_deps] all ${#PKGS[@]} packages present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "[install_deps] installing: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "[install_deps] done"
