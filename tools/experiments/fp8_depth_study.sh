#!/usr/bin/env bash
# FP8 at depth in one command (docs/fp8_depth.md, issue 30): builds lns_train and
# lns_eval, makes the width-64 study's tokens (bpe_corpus.py), runs the grid of
# depth_study.py --study fp8 (Pre-LN, LNS and Mix-LN at 12, 24 and 48 blocks, each with
# --fp8=delayed and without, seeds 1-3; resumable, finished cells skipped), then writes
# the tables of docs/fp8_depth.md and its figures (fp8_depth_doc.py).
#   bash tools/experiments/fp8_depth_study.sh [GRID]     GRID: fp8 (default) or fp8_mini
# Environment: DEVICE (cpu; cuda on a GPU node: a -DLNS_CUDA=ON build in build-cuda, the
#   records in docs/fp8_depth_runs_cuda beside the bf16 baselines of
#   docs/depth_study_runs_cuda), JOBS (1), THREADS (0: cores / JOBS), NICE (19), DOC
#   (docs/fp8_depth.md; empty: do not edit it).
# Stop it at any time (Ctrl-C: running trainings save a checkpoint); the same command resumes.
set -euo pipefail
cd "$(dirname "$0")/../.."
GRID=${1:-fp8}
DEVICE=${DEVICE:-cpu}
case $DEVICE in
  cpu) BUILD=build; CONF=() ;;
  cuda) BUILD=build-cuda; CONF=(-DLNS_CUDA=ON) ;;
  *) echo "fp8_depth_study.sh: DEVICE=$DEVICE: expected cpu or cuda" >&2; exit 2 ;;
esac
JOBS=${JOBS:-1}
THREADS=${THREADS:-0}
NICE=${NICE:-19}
DOC=${DOC-docs/fp8_depth.md}
S=tools/experiments/depth_study.py
RECORD=$(python3 $S --study fp8 --device "$DEVICE" --print_record)
BASELINE=$(python3 $S --study width64 --device "$DEVICE" --print_record)
SUFFIX=$([ "$DEVICE" = cuda ] && echo _cuda || true)
source launch/env.sh

cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "${CONF[@]}" >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target lns_train lns_eval >/dev/null
python3 tools/experiments/bpe_corpus.py --out data/fortunes_bpe4k
rc=0  # a failed run is reported, and the tables still cover the runs that finished
python3 $S --study fp8 --grid "$GRID" --jobs "$JOBS" --threads "$THREADS" --nice "$NICE" --device "$DEVICE" \
  --bin "$BUILD" || rc=$?
if [ -n "$DOC" ]; then
  python3 tools/experiments/fp8_depth_doc.py --fp8 "$RECORD" --baseline "$BASELINE" --doc "$DOC" \
    --plots docs/images --prefix "fp8_depth$SUFFIX" --marker "fp8_depth$SUFFIX"
fi
exit $rc
