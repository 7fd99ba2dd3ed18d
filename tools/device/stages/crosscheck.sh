# shellcheck shell=bash
# A stage of tools/device/run_gpu.sh (STAGES):
#   crosscheck issue 31's CPU f32 cross-check: the scale study's smallest cell (12 blocks,
#              Pre-LN) for its first CROSSCHECK_STEPS (4) steps on this machine's CPU cores
#              and on the GPU, from the same weights and batches
#              (tools/experiments/scale_crosscheck.py; needs data/realtext, STAGES=data);
#              the record as $OUT/scale_crosscheck.json (commit it as
#              docs/depth_study_scale_crosscheck.json)
# Sourced by tools/device/run_gpu.sh in its own shell: it reads and sets the driver's
# variables (settings.sh) and calls its functions (common.sh, deps.sh).

# Issue 31's CPU f32 cross-check (docs/depth_study_scale.md): one lns_train runs both
# devices; the CPU run takes every core (about 4 x 150 s on 2 cores, 2026-11-28).
if [ -f data/realtext.train.tok ]; then
  step crosscheck "$RUNLOG" env PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 python3 tools/experiments/scale_crosscheck.py \
    --cpu_bin "$BIN_DIR" --cuda_bin "$BIN_DIR" --steps "${CROSSCHECK_STEPS:-4}" --threads "$(nproc)" \
    --out /tmp/lns-crosscheck --record "$OUT/scale_crosscheck.json"
else
  log "crosscheck: no data/realtext.train.tok here: run STAGES=data with .gpu-data carried first"
  FAILED=1
fi
