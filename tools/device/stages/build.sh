# shellcheck shell=bash
# A stage of tools/device/run_gpu.sh (STAGES):
#   configure  cmake -S . -B $BUILD_DIR -G Ninja -DLNS_CUDA=ON -DCMAKE_BUILD_TYPE=Release
#   build      configure + cmake --build $BUILD_DIR -j $JOBS
# Sourced by tools/device/run_gpu.sh in its own shell: it reads and sets the driver's
# variables (settings.sh) and calls its functions (common.sh, deps.sh).

: > "$OUT/build.log"
gen=()
if command -v ninja >/dev/null && ! grep -qs '^CMAKE_GENERATOR:INTERNAL=Unix Makefiles' "$BUILD_DIR/CMakeCache.txt"; then
  gen=(-G Ninja)
fi
U=$PREFIX/usr
hints=()
if [ -x "$U/bin/mpicxx" ]; then
  hints=(-DMPI_CXX_COMPILER="$U/bin/mpicxx" -DMPIEXEC_EXECUTABLE="$U/bin/mpirun"
         -DCBLAS_INCLUDE_DIR="$U/include/$ARCH/openblas-pthread")
fi
# shellcheck disable=SC2086  # CMAKE_ARGS is a list of words
step configure "$OUT/build.log" cmake -S . -B "$BUILD_DIR" "${gen[@]}" -DLNS_CUDA="$LNS_CUDA" \
  -DCMAKE_BUILD_TYPE=Release "${hints[@]}" $CMAKE_ARGS
cfg_rc=$?
if has_stage build && [ $cfg_rc -eq 0 ]; then
  step build "$OUT/build.log" cmake --build "$BUILD_DIR" -j "$JOBS"
fi
grep -E '^### (step|done) ' "$OUT/build.log" >> "$RUNLOG"
