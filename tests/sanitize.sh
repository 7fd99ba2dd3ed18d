#!/usr/bin/env bash
# The file-format tests (ctest label "format": checkpoints, safetensors, token files,
# conversion, hostile input, the tools on it, the fuzz pass) built with
# -fsanitize=address,undefined in their own build directory, so that a memory error or
# undefined behaviour in any reader fails CI. Only those tests and the three tools they
# run are built (no CUDA); with them the cuBLASLt/NCCL stand-ins of the emulation build
# on their test stub (label "sim"). The build, its targets and the sanitizers' options
# (leak checking off: Open MPI leaks by design; every other report fatal) are the asan
# presets of CMakePresets.json. OpenBLAS and MPI are not instrumented; our code is.
# Called by tests/run.sh; runs on its own too.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
cmake --preset asan >/dev/null
cmake --build --preset asan -j"$(nproc)"
ctest --preset asan -j"$(nproc)"
