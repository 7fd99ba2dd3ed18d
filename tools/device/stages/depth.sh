# shellcheck shell=bash
# A stage of tools/device/run_gpu.sh (STAGES):
#   depth      the depth study's grid with --device=cuda (DEPTH_STUDY width64, scale: issue
#              31's width-512 grid on data/realtext, or fp8: issue 30's FP8-at-depth grid
#              beside the width-64 bf16 cells, docs/fp8_depth.md; DEPTH_GRID full, DEPTH_JOBS 4,
#              DEPTH_SECONDS 0 = no limit, DEPTH_OUT /tmp/depth_study_cuda), the cells
#              recorded in docs/depth_study_runs_cuda skipped; the records and the runs'
#              logs come back as $OUT/depth_study_cuda.tgz. Needs data/fortunes_bpe4k.*
#              (tools/experiments/bpe_corpus.py here; carry data)
# Sourced by tools/device/run_gpu.sh in its own shell: it reads and sets the driver's
# variables (settings.sh) and calls its functions (common.sh, deps.sh).

# The depth study's grid on the GPU (docs/depth_study.md): resumable, so a second call on
# the same machine goes on; DEPTH_SECONDS stops it (SIGTERM: running trainings save a
# checkpoint) in time to pack the records, which come back as one archive ($OUT keeps
# few files). The records go to their own folder: bf16 GPU runs are a separate study.
# The records that travelled (docs/depth_study_runs_cuda) say which cells are finished.
# DEPTH_STUDY=scale runs issue 31's grid (width 512 on the real corpus, which travels
# as .gpu-data: tools/device/pack_data.sh) instead of the width-64 one.
# DEPTH_STUDY=fp8 runs issue 30's grid: its FP8 cells' records, and the width-64 bf16
# cells it pairs them with (docs/depth_study_runs_cuda), both come back.
DEPTH_STUDY=${DEPTH_STUDY:-width64}
case $DEPTH_STUDY in
  scale) def_grid=scale; def_jobs=2; tag=_scale ;;
  fp8) def_grid=fp8; def_jobs=4; tag=_fp8 ;;
  *) def_grid=full; def_jobs=4; tag="" ;;
esac
DEPTH_OUT=${DEPTH_OUT:-/tmp/depth_study${tag}_cuda}
DEPTH_RECORD=$ROOT/$(python3 tools/experiments/depth_study.py --study "$DEPTH_STUDY" --device cuda --print_record)
BASE_RECORD=$ROOT/$(python3 tools/experiments/depth_study.py --study width64 --device cuda --print_record)
mkdir -p "$DEPTH_OUT" "$DEPTH_RECORD" "$BASE_RECORD"
RECORDS=("$(basename "$DEPTH_RECORD")")
[ "$DEPTH_STUDY" = fp8 ] && RECORDS+=("$(basename "$BASE_RECORD")")
step depth "$RUNLOG" timeout -s TERM "${DEPTH_SECONDS:-0}" env PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 \
  python3 tools/experiments/depth_study.py --study "$DEPTH_STUDY" --grid "${DEPTH_GRID:-$def_grid}" --device cuda \
  --bin "$BIN_DIR" --jobs "${DEPTH_JOBS:-$def_jobs}" --threads 2 --out "$DEPTH_OUT" --record "$DEPTH_RECORD"
# the records, and every run's logs (why one failed; its throughput)
(cd "$DEPTH_OUT" && find . \( -name '*.log' -o -name result.json \) -print |
   tar czf "$OUT/depth_study${tag}_cuda.tgz" -C "$(dirname "$DEPTH_RECORD")" "${RECORDS[@]}" \
     -C "$DEPTH_OUT" -T -) || FAILED=1
