#!/usr/bin/env bash
# Installs the dependencies, builds lns and runs the whole test suite through ctest.
# Idempotent; the second run rebuilds only what changed (ccache helps after a clean).
# Each build is a preset of CMakePresets.json (cmake --preset X: its directory and cache
# variables) and each phase a test preset there (the labels it selects, the checks'
# environment); tests/README.md says what each label means.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each part's wall time, so that the hour CI allows is spent where one can see it.
PHASE_START=$SECONDS
phase_done() {
  echo "tests/run.sh: $1 took $((SECONDS - PHASE_START)) s (total $SECONDS s)"
  PHASE_START=$SECONDS
}
bash tools/install_deps.sh
phase_done "install_deps"
# mpirun refuses to run as root unless told it may (containers, CI).
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
cmake --preset cpu >/dev/null
cmake --build --preset cpu -j"$(nproc)"
phase_done "CPU build"
ctest --preset cpu -j"$(nproc)"
phase_done "CPU tests"

# ---- OpenBLAS kernels: the numerics again under each kernel family the CPU runs -----
# The run above uses whatever kernel OpenBLAS picks here (its generic one on CPUs it does
# not know, unless OPENBLAS_CORETYPE is set): every test must pass whichever it is. The
# tests whose numbers flow through BLAS (unit: ops, model against PyTorch's golden
# values; mpi: every layout against one rank) run once more under each of Prescott
# (generic), Haswell (AVX2) and SkylakeX (AVX-512), those this CPU supports.
# LNS_BLAS_KERNELS=OFF skips this part; a list (e.g. "Haswell") runs those only.
BLAS_KERNELS=${LNS_BLAS_KERNELS:-Prescott Haswell SkylakeX}
if [ "$BLAS_KERNELS" != "OFF" ]; then
  for k in $BLAS_KERNELS; do
    case $k in
      Haswell) grep -qw avx2 /proc/cpuinfo || { echo "tests/run.sh: no AVX2: kernel $k skipped"; continue; } ;;
      SkylakeX) grep -qw avx512f /proc/cpuinfo || { echo "tests/run.sh: no AVX-512: kernel $k skipped"; continue; } ;;
    esac
    echo "tests/run.sh: unit and mpi tests under OPENBLAS_CORETYPE=$k"
    OPENBLAS_CORETYPE=$k ctest --preset blas -j"$(nproc)"
    phase_done "unit and mpi tests under $k"
  done
fi

# ---- sanitizers: the file-format tests under ASan/UBSan (build-asan/) --------------
# LNS_SANITIZE=OFF skips this part.
if [ "${LNS_SANITIZE:-ON}" != "OFF" ]; then
  bash tests/sanitize.sh
  phase_done "sanitizers"
fi

# ---- the SIMT emulator: every `gpu` test with the kernels running on the CPU --------
# (docs/cuda.md), in two builds. LNS_CUDA_SIM=OFF skips this part. The runs too long
# for a build carry a label saying so at their ctest entries (tests/gpu/CMakeLists.txt):
# `long` (minutes even in Release) and `asan_long` (minutes under ASan only).
if [ "${LNS_CUDA_SIM:-ON}" != "OFF" ]; then
  # 1. Under ASan/UBSan (build-sim/): memory errors, the two-order check, the
  #    write-write race check and the cross-stream race check (on the accesses that
  #    copies and the cuBLASLt/NCCL stand-ins declare: the kernels have no access hooks
  #    here); every `gpu` test but those labelled slow, long or asan_long.
  cmake --preset sim-asan >/dev/null
  cmake --build --preset sim-asan -j"$(nproc)"
  phase_done "emulator build (ASan)"
  ctest --preset sim-asan -j"$(nproc)"
  phase_done "emulator tests (ASan)"
  # 2. Release (build-sim-rel/): the kernels carry the access hooks, so the race check
  #    sees reads too (GCC's -fsanitize=thread instrumentation, which excludes ASan),
  #    and so does the cross-stream race check; every `gpu` test under both but the
  #    long runs and the multi-rank stand-in tests (the multi-rank ones set the
  #    cross-stream check alone in their ctest entries), then the long runs (labels
  #    long and slow) under the cross-stream check only.
  cmake --preset sim-release >/dev/null
  cmake --build --preset sim-release -j"$(nproc)"
  phase_done "emulator build (Release)"
  ctest --preset sim-release -j"$(nproc)"
  ctest --preset sim-release-long -j"$(nproc)"
  phase_done "emulator tests (Release)"
fi

# The CUDA backend (-DLNS_CUDA=ON), built wherever the toolkit is so that it never
# rots, then its `gpu` tests: they run on a machine with a GPU and report "skipped"
# (with the reason) on one without; and the `sass` tests, the static check of the
# compiled kernels (tools/perf/sass_check.py: spills, registers, 128-bit accesses).
# LNS_CUDA=OFF skips this part; LNS_CUDA=ON makes a
# missing toolkit an error.
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}  # the cuda preset's nvcc
if [ "${LNS_CUDA:-auto}" = "ON" ] && [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
  echo "tests/run.sh: LNS_CUDA=ON but $CUDA_HOME/bin/nvcc does not exist (set CUDA_HOME)" >&2
  exit 1
fi
if [ "${LNS_CUDA:-auto}" != "OFF" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then
  # cuDNN's headers, so that the real --attention=cudnn path is compiled too (docs/cuda.md)
  bash tools/fetch_cudnn.sh || echo "tests/run.sh: warning: no cuDNN headers: the CUDA build leaves --attention=cudnn out" >&2
  cmake --preset cuda >/dev/null
  cmake --build --preset cuda -j"$(nproc)"
  phase_done "CUDA build"
  ctest --preset cuda
  phase_done "CUDA gpu and sass tests"
else
  echo "tests/run.sh: no CUDA toolkit at $CUDA_HOME: the CUDA backend was not built"
fi
