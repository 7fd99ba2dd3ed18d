#!/usr/bin/env bash
# Builds lns with CUDA on an OFFLINE GPU node, runs the GPU tests and the
# benchmarks (ours and the PyTorch references), and prints a summary table.
# Run from anywhere; it works in the repo root:
#
#   bash tools/device/run_gpu.sh                   # all stages
#   STAGES="build test" bash tools/device/run_gpu.sh
#   STAGES=bench CONFIGS=130m_lns bash tools/device/run_gpu.sh
#   PRESET=tools/device/lease.env bash tools/device/run_gpu.sh   # what is still unmeasured
#   DRY_RUN=1 PRESET=tools/device/lease.env bash tools/device/run_gpu.sh   # its plan and time
#
# Why: the node has CUDA, CMake, ninja, a compiler and PyTorch, but none of our
# Debian dependencies and no registry. tools/device/pack.sh (on a Debian 12
# machine) put their .debs into .gpu-deps/debs/; here they are unpacked with
# `dpkg -x` into a private prefix (default /tmp/lns-deps, never /), and
# PATH / LD_LIBRARY_PATH / CMAKE_PREFIX_PATH and Open MPI's relocation
# variables (OPAL_PREFIX, PMIX_*) point there. Checked on Debian 12 with the
# system's copies hidden: configure, CPU build, unit and MPI tests pass. Debian's
# update-alternatives links (mpirun, mpicxx, libopenblas.so, ...), which
# package scripts would make, are made by hand.
#
# This file is the driver; the work is in tools/device/stages/, each file sourced into
# this shell in turn: settings.sh (every setting, e.g. PRESET, STAGES, CONFIGS, VARIANTS,
# DRY_RUN), common.sh (step, the record after each step, the signal handler), deps.sh and
# setup.sh (the set-up every call runs; STAGES=data is that alone), then one file per
# stage. The stages run in this order, whatever order STAGES names them in; the bench
# stage comes before the tests, so that a call cut off at its limit keeps its figures:
# configure and build (build.sh), bench, test, multi, fp8gap, crosscheck, depth.
#
# Results in $OUT (few files, as the device tool brings back at most 8):
#   env.json     date, GPU name and driver, nvcc, glibc, git commit, stages
#   run.log      every stage but the build, between '### step NAME' and
#                '### done NAME rc=RC seconds=S' lines (RESULT lines inside)
#   build.log    configure + build output
#   kernels.json, kernels_torch.json   the kernel benchmarks' figures
#   <gpu>-<date>.json   the run's record (tools/device/bench_record.py), rewritten after
#                every step from the bench stage on
#   summary.md   the table printed at the end (tools/device/summarize.py)
#   plan.tsv     DRY_RUN=1 only: each step, its limit, its command
# Exit status: 0 when every stage that ran succeeded, else 1.
set -uo pipefail
# shellcheck source-path=SCRIPTDIR

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
STAGE_DIR=$ROOT/tools/device/stages
# shellcheck source=stages/settings.sh
. "$STAGE_DIR/settings.sh"
# shellcheck source=stages/common.sh
. "$STAGE_DIR/common.sh"
# shellcheck source=stages/deps.sh
. "$STAGE_DIR/deps.sh"
# shellcheck source=stages/setup.sh
. "$STAGE_DIR/setup.sh"

if has_stage configure || has_stage build; then
  # shellcheck source=stages/build.sh
  . "$STAGE_DIR/build.sh"
fi
# From here on a signal ends the running step and rewrites the record (common.sh).
trap on_signal TERM INT
for RUN_GPU_STAGE in bench test multi fp8gap crosscheck depth; do
  if has_stage "$RUN_GPU_STAGE"; then
    # shellcheck disable=SC1090
    . "$STAGE_DIR/$RUN_GPU_STAGE.sh"
  fi
done

if [ "$DRY_RUN" = 1 ]; then  # what the call would run and how long that takes
  echo
  PYTHONDONTWRITEBYTECODE=1 python3 "$ROOT/tools/device/predict.py" "$PLAN"
  exit $?
fi
if [ "$RECORDING" = 1 ]; then
  rec=$(PYTHONDONTWRITEBYTECODE=1 python3 "$ROOT/tools/device/bench_record.py" "$OUT" --out "$OUT" --update) &&
    log "the run's record: $rec" || FAILED=1
fi
echo
PYTHONDONTWRITEBYTECODE=1 python3 "$ROOT/tools/device/summarize.py" "$OUT" | tee "$OUT/summary.md"
exit "$FAILED"
