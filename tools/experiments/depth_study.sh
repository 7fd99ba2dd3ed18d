#!/usr/bin/env bash
# The depth study in one command (docs/depth_study.md): builds lns_train, lns_eval and
# lns_convert, trains a 4k BPE on the fortunes corpus (tools/experiments/bpe_corpus.py),
# runs the grid (tools/experiments/depth_study.py: resumable, skips finished runs, a
# progress line with ETA), then the statistics and figures (depth_report.py) and the
# tables of docs/depth_study.md (depth_doc.py).
#   bash tools/experiments/depth_study.sh [GRID]      GRID: session (default), full, smoke
# Environment: OUT (default runs/depth_study_v2), JOBS (2), NICE (19: only idle CPU),
#   DEVICE (cpu; cuda on a GPU node), DOC (docs/depth_study.md; empty: do not edit it),
#   RECORD (docs/depth_study_runs: run summaries kept in the repository; a cell recorded
#   there, or summarised in its prior_*.json, is finished), THREADS (0: cores / JOBS).
# Stop it at any time (Ctrl-C: running trainings save a checkpoint); the same command resumes.
set -euo pipefail
cd "$(dirname "$0")/../.."
GRID=${1:-session}
OUT=${OUT:-runs/depth_study_v2}
JOBS=${JOBS:-2}
NICE=${NICE:-19}
DEVICE=${DEVICE:-cpu}
DOC=${DOC-docs/depth_study.md}
RECORD=${RECORD-docs/depth_study_runs}   # each finished run's summary, kept in git (runs/ is not)
THREADS=${THREADS:-0}                    # OpenBLAS threads per run; 1 on a busy machine
source launch/env.sh

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target lns_train lns_eval lns_convert >/dev/null
python3 tools/experiments/bpe_corpus.py --out data/fortunes_bpe4k
rc=0  # a failed run is reported, and the report still covers the runs that finished
python3 tools/experiments/depth_study.py --grid "$GRID" --out "$OUT" --jobs "$JOBS" --nice "$NICE" --device "$DEVICE" \
  --record "$RECORD" --threads "$THREADS" || rc=$?
python3 tools/experiments/depth_report.py "$OUT" --records "$RECORD" --plots docs/images
if [ -n "$DOC" ]; then
  python3 tools/experiments/depth_doc.py "$OUT/report.json" --doc "$DOC" --grid "$GRID,full" --study "$OUT" --jobs "$JOBS" \
    --record "$RECORD"
fi
echo "depth_study: report $OUT/report.json, figures docs/images/depth_study_*.png"
exit $rc
