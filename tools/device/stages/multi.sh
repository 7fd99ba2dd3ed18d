# shellcheck shell=bash
# A stage of tools/device/run_gpu.sh (STAGES):
#   multi      tests/gpu/test_layouts_one_gpu.py: every parallel layout over
#              --comm=mpi on this one GPU (tp2, pp2, dp2 with ZeRO, tp2 with sequence
#              parallelism, pp2 interleaved, tp2 x pp2 x dp2, tp2 x pp2 with
#              --recompute=full) against the one-rank CUDA run, and a resume under
#              another layout on the GPU and the CPU, and NCCL's collectives at a
#              world of one rank (issue 29; under 2 minutes)
# Sourced by tools/device/run_gpu.sh in its own shell: it reads and sets the driver's
# variables (settings.sh) and calls its functions (common.sh, deps.sh).

step multi "$RUNLOG" env LNS_TRAIN_BIN="$BIN_DIR/lns_train" LNS_EVAL_BIN="$BIN_DIR/lns_eval" MPIRUN=mpirun \
  PYTHONDONTWRITEBYTECODE=1 python3 tests/gpu/test_layouts_one_gpu.py
# NCCL for real at a world of one rank (the only NCCL a one-GPU machine can run)
mpi_tests=$BIN_DIR/tests/lns_mpi_tests
[ -x "$mpi_tests" ] || mpi_tests=$BIN_DIR/lns_mpi_tests
step nccl_one_rank "$RUNLOG" mpirun -np 1 "$mpi_tests" --device=cuda --comm=nccl --gtest_filter='NcclOneRank.*'
