# Sourced by the launchers (quickstart, benchmarks): runtime settings for the CPU path.
# OpenBLAS 0.3.21 does not recognise recent Xeons and falls back to its generic SSE3
# ("Prescott") kernels, about 2x slower here. Pick the newest kernel family the CPU
# supports, unless the machine already chose one (some do, for older OpenBLAS bugs).
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
  if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
    export OPENBLAS_CORETYPE=SkylakeX
  elif grep -qw avx2 /proc/cpuinfo 2>/dev/null; then
    export OPENBLAS_CORETYPE=Haswell
  fi
fi
# mpirun refuses to run as root unless told it may (containers).
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
