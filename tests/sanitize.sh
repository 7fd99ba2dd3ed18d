#!/usr/bin/env bash
# The file-format tests (ctest label "format": checkpoints, safetensors, token files,
# conversion, hostile input, the tools on it, the fuzz pass) built with
# -fsanitize=address,undefined in their own build directory, so that a memory error or
# undefined behaviour in any reader fails CI. Only those tests and the three tools they
# run are built (no CUDA); with them the cuBLASLt/NCCL stand-ins of the emulation build
# on their test stub (label "sim"). Called by tests/run.sh; runs on its own too.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
BUILD_DIR=${SANITIZE_BUILD_DIR:-build-asan}
# -O1 -g1: quick to compile, fast enough to run, line numbers in reports.
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" \
      -DLNS_SANITIZE=ON >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" --target lns_format_tests lns_train lns_eval lns_convert \
      lns_sim_cublaslt_tests lns_sim_nccl_tests
# Open MPI (MPI_Init in the tools) leaks by design: leak checking off, everything else
# fatal. OpenBLAS and MPI are not instrumented; our code is.
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=1:detect_stack_use_after_return=0
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
ctest --test-dir "$BUILD_DIR" -L "format|sim" --output-on-failure -j"$(nproc)"
