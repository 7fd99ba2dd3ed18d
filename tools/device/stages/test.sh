# shellcheck shell=bash
# A stage of tools/device/run_gpu.sh (STAGES):
#   test       ctest --test-dir $BUILD_DIR -L $TEST_LABEL --output-on-failure
# Sourced by tools/device/run_gpu.sh in its own shell: it reads and sets the driver's
# variables (settings.sh) and calls its functions (common.sh, deps.sh).

if [ -f "$BUILD_DIR/CTestTestfile.cmake" ]; then
  # shellcheck disable=SC2086  # CTEST_ARGS is a list of words
  step test "$RUNLOG" ctest --test-dir "$BUILD_DIR" -L "$TEST_LABEL" --output-on-failure $CTEST_ARGS
else
  # No build here (pack.sh --binaries carried the programs): the single-GPU tests
  # from the carried test programs; the multi-rank ones need a build (ctest).
  # Each test in a process of its own (tools/device/gtest_each.sh): one that aborts
  # hides none of the others. GTEST_FILTER: a chosen subset, e.g. the kernels a change touched.
  if [ -n "${GTEST_FILTER:-}" ]; then
    step test_gpu "$RUNLOG" bash tools/device/gtest_each.sh "$BIN_DIR/lns_gpu_tests" "$GTEST_FILTER"
  else
    step test_gpu "$RUNLOG" bash tools/device/gtest_each.sh "$BIN_DIR/lns_gpu_tests" '*' \
      --gtest_also_run_disabled_tests
    step test_tiny_run "$RUNLOG" env LNS_TRAIN_BIN="$BIN_DIR/lns_train" PYTHONDONTWRITEBYTECODE=1 \
      python3 tests/gpu/test_tiny_run.py
  fi
fi
