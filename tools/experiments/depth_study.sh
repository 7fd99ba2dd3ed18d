#!/usr/bin/env bash
# The depth study in one command (docs/depth_study.md): builds lns_train, lns_eval and
# lns_convert, trains a 4k BPE on the fortunes corpus (tools/experiments/bpe_corpus.py),
# runs the grid (tools/experiments/depth_study.py: resumable, skips finished runs, a
# progress line with ETA), then the statistics and figures (depth_report.py) and the
# tables of docs/depth_study.md (depth_doc.py).
#   bash tools/experiments/depth_study.sh [GRID]      GRID: session (default), full, smoke
# Environment: DEVICE (cpu; cuda on a GPU node: a -DLNS_CUDA=ON build in build-cuda, the
#   records in docs/depth_study_runs_cuda, the tables between the depth_doc_cuda markers, the
#   figures docs/images/depth_study_cuda_*.png: bf16 GPU runs are a study of their own),
#   OUT (runs/depth_study_v2, runs/depth_study_cuda), JOBS (2; 4 on a GPU), NICE (19: only
#   idle CPU), DOC (docs/depth_study.md; empty: do not edit it), RECORD (the run summaries
#   kept in the repository; a cell recorded there, or summarised in its prior_*.json, is
#   finished), THREADS (0: cores / JOBS).
# Stop it at any time (Ctrl-C: running trainings save a checkpoint); the same command resumes.
set -euo pipefail
cd "$(dirname "$0")/../.."
GRID=${1:-session}
DEVICE=${DEVICE:-cpu}
case $DEVICE in
  cpu) SUFFIX=""; BUILD=build; CONF=(); DEF_OUT=runs/depth_study_v2; DEF_JOBS=2 ;;
  cuda) SUFFIX=_cuda; BUILD=build-cuda; CONF=(-DLNS_CUDA=ON); DEF_OUT=runs/depth_study_cuda; DEF_JOBS=4 ;;
  *) echo "depth_study.sh: DEVICE=$DEVICE: expected cpu or cuda" >&2; exit 2 ;;
esac
OUT=${OUT:-$DEF_OUT}
JOBS=${JOBS:-$DEF_JOBS}
NICE=${NICE:-19}
DOC=${DOC-docs/depth_study.md}
# each finished run's summary, kept in git (runs/ is not); depth_study.py knows each device's folder
RECORD=${RECORD-$(python3 tools/experiments/depth_study.py --device "$DEVICE" --print_record)}
THREADS=${THREADS:-0}                    # OpenBLAS threads per run; 1 on a busy machine
source launch/env.sh

cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release "${CONF[@]}" >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target lns_train lns_eval lns_convert >/dev/null
python3 tools/experiments/bpe_corpus.py --out data/fortunes_bpe4k
rc=0  # a failed run is reported, and the report still covers the runs that finished
python3 tools/experiments/depth_study.py --grid "$GRID" --out "$OUT" --jobs "$JOBS" --nice "$NICE" --device "$DEVICE" \
  --bin "$BUILD" --record "$RECORD" --threads "$THREADS" || rc=$?
mkdir -p "$OUT"
python3 tools/experiments/depth_report.py "$OUT" --records "$RECORD" --plots docs/images --prefix "depth_study$SUFFIX"
if [ -n "$DOC" ]; then
  python3 tools/experiments/depth_doc.py "$OUT/report.json" --doc "$DOC" --grid "$GRID,full" --study "$OUT" --jobs "$JOBS" \
    --record "$RECORD" --marker "depth_doc$SUFFIX"
fi
echo "depth_study: report $OUT/report.json, figures docs/images/depth_study${SUFFIX}_*.png"
exit $rc
