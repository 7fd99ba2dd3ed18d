# shellcheck shell=bash
# A stage of tools/device/run_gpu.sh (STAGES):
#   fp8gap     issue 30's loss gap: 130M trained with --fp8=none and --fp8=delayed on
#              data/realtext (tools/experiments/fp8_gap.py; FP8_STEPS 2000, FP8_BATCH 64),
#              the record as $OUT/fp8_gap.json
# Sourced by tools/device/run_gpu.sh in its own shell: it reads and sets the driver's
# variables (settings.sh) and calls its functions (common.sh, deps.sh).

# Issue 30's loss gap (docs/fp8.md): the 130M model trained twice, bf16 and
# --fp8=delayed, on the same real text (data/realtext.*: a call that carried .gpu-data
# earlier on this machine, STAGES=data), seed and batches; the record comes back as
# $OUT/fp8_gap.json. FP8_STEPS (2000) and FP8_BATCH (64 sequences of 256 tokens).
if [ -f data/realtext.train.tok ]; then
  step fp8gap "$RUNLOG" python3 tools/experiments/fp8_gap.py --lns_train "$BIN_DIR/lns_train" \
    --flagfile configs/130m_lns.flags --out /tmp/lns-fp8gap --json "$OUT/fp8_gap.json" -- \
    --data=data/realtext.train.tok --val_data=data/realtext.val.tok --vocab_size=32768 --data_mode=packed \
    --global_batch_size="${FP8_BATCH:-64}" --micro_batch_size="${FP8_BATCH:-64}" --steps="${FP8_STEPS:-2000}" \
    --warmup_steps=200 --eval_every=0 --eval_tokens=262144 --log_every=100
else
  log "fp8gap: no data/realtext.train.tok here: run STAGES=data with .gpu-data carried first"
  FAILED=1
fi
