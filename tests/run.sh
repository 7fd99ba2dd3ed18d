#!/usr/bin/env bash
# Installs the dependencies, builds lns and runs the whole test suite through ctest.
# Idempotent; the second run rebuilds only what changed (ccache helps after a clean).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh
# mpirun refuses to run as root unless told it may (containers, CI).
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)"
ctest --test-dir "$BUILD_DIR" --output-on-failure -j"$(nproc)"
