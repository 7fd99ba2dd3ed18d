# shellcheck shell=bash
# A stage of tools/device/run_gpu.sh (STAGES):
#   bench      lns_bench_kernels, bench_kernels_torch.py, and for each of
#              $CONFIGS lns_bench_step --profile, lns_bench_step --cuda_graphs,
#              lns_bench_step --attention=cudnn, the FP8 steps and
#              bench_step_torch.py --compile (at the config's FFN and padded to a
#              multiple of 64; at seq 4096 the padded one only, unless VARIANTS names
#              torch); tools/device/bench_record.py rewrites the run's record
#              <gpu>-<date>.json after every step of the run from here on (the tests'
#              verdicts too: a step variant's figure counts only where its correctness
#              test passed in the same record), atomically, so that a call cut off at
#              its limit leaves a record of what finished
# Sourced by tools/device/run_gpu.sh in its own shell: it reads and sets the driver's
# variables (settings.sh) and calls its functions (common.sh, deps.sh).

RECORDING=1
# shellcheck disable=SC2086  # BENCH_LAUNCHER is a command line
if [ "${KERNELS:-1}" != 0 ]; then
  # shellcheck disable=SC2086
  step kernels "$RUNLOG" $BENCH_LAUNCHER "$BIN_DIR/lns_bench_kernels" --flagfile=configs/1b_lns.flags \
    --json="$OUT/kernels.json"
  # 130M's GEMMs too (hidden 768: 1.65x their bound at 130M against 1.43x at 1B), pass
  # by pass with the heuristic's candidates and the fused shapes
  # shellcheck disable=SC2086
  step kernels_130m_lns "$RUNLOG" $BENCH_LAUNCHER "$BIN_DIR/lns_bench_kernels" --flagfile=configs/130m_lns.flags \
    --sections=step_gemm --json="$OUT/kernels_130m_lns.json"
fi
if [ "${KERNELS_TORCH:-1}" != 0 ]; then
  step kernels_torch "$RUNLOG" "${TORCH_ENV[@]}" python3 tools/bench/bench_kernels_torch.py \
    --json "$OUT/kernels_torch.json"
fi
# Per config: lns (with the per-class profile; PROFILE=0 skips it), then the fair
# PyTorch peer, torch.compile + fused AdamW + autocast, at the config's FFN and with
# the FFN padded to a multiple of 64 as lns pads it (where that changes the shape;
# seq 4096 is compared padded only, unless VARIANTS names its unpadded peer, torch,
# to keep the call short: its compile alone took over two minutes on an H100, so it
# wants a limit of its own, TIMEOUT_step_torch_padded_1b_lns_seq4k).
for cfg in $CONFIGS; do
  prof=()
  [ "${PROFILE:-1}" = 0 ] || ! want "$cfg" profile || prof=(--profile)
  if want "$cfg" lns; then
    # shellcheck disable=SC2086
    step "step_$cfg" "$RUNLOG" $BENCH_LAUNCHER "$BIN_DIR/lns_bench_step" --flagfile="configs/$cfg.flags" \
      --device=cuda --bench_steps="$LNS_STEPS" --bench_warmup=2 "${prof[@]}"
  fi
  if [ "${GRAPHS:-1}" != 0 ] && want "$cfg" graphs; then  # the same step with its micro-batches as CUDA graphs
    # shellcheck disable=SC2086
    step "step_graphs_$cfg" "$RUNLOG" $BENCH_LAUNCHER "$BIN_DIR/lns_bench_step" --flagfile="configs/$cfg.flags" \
      --device=cuda --bench_steps="$LNS_STEPS" --bench_warmup=2 --cuda_graphs
  fi
  if [ "${CUDNN:-1}" != 0 ] && want "$cfg" cudnn; then  # with cuDNN's fused attention (profiled: the fastest bf16 step)
    # shellcheck disable=SC2086
    step "step_cudnn_$cfg" "$RUNLOG" $BENCH_LAUNCHER "$BIN_DIR/lns_bench_step" --flagfile="configs/$cfg.flags" \
      --device=cuda --bench_steps="$LNS_STEPS" --bench_warmup=2 --attention="${CUDNN_ATTENTION:-cudnn}" \
      "${prof[@]}"
  fi
  # The FP8 steps take the fastest bf16 step's attention (cuDNN where its library is
  # here), so that their ratio to it is the linears' alone.
  fp8_attn=()
  [ "${CUDNN:-1}" != 0 ] && [ -n "${LNS_CUDNN_LIB:-}" ] && [ -f "$LNS_CUDNN_LIB" ] &&
    fp8_attn=(--attention="${CUDNN_ATTENTION:-cudnn}")
  if [ "${FP8:-1}" != 0 ] && want "$cfg" fp8; then  # FP8 linears (docs/fp8.md): issue 30's >= 1.3x
    # (profiled too: its FP8 casts are a row of their own)
    # shellcheck disable=SC2086
    step "step_fp8_$cfg" "$RUNLOG" $BENCH_LAUNCHER "$BIN_DIR/lns_bench_step" --flagfile="configs/$cfg.flags" \
      --device=cuda --bench_steps="$LNS_STEPS" --bench_warmup=2 --fp8=delayed "${fp8_attn[@]}" "${prof[@]}"
  fi
  if [ "${FP8:-1}" != 0 ] && want "$cfg" fp8bw; then  # 1 x 128 / 128 x 128 tile scales (profiled:
    # on an H200 it was 1.31x slower than bf16, 2026-11-28, and where that goes is not known)
    # shellcheck disable=SC2086
    step "step_fp8bw_$cfg" "$RUNLOG" $BENCH_LAUNCHER "$BIN_DIR/lns_bench_step" --flagfile="configs/$cfg.flags" \
      --device=cuda --bench_steps="$LNS_STEPS" --bench_warmup=2 --fp8=blockwise "${fp8_attn[@]}" "${prof[@]}"
  fi
  [ "${TORCH:-1}" = 0 ] && continue
  torch_args=(--flagfile="configs/$cfg.flags" --device cuda --autocast --compile --fused_adam
              --steps "$TORCH_STEPS" --warmup 2)
  if want "$cfg" torch && { [[ $cfg != *seq4k* ]] || named "$cfg" torch; }; then
    step "step_torch_$cfg" "$RUNLOG" "${TORCH_ENV[@]}" python3 tools/bench/bench_step_torch.py "${torch_args[@]}"
  fi
  ffn=$(sed -n 's/^--intermediate_size=\([0-9]*\).*/\1/p' "configs/$cfg.flags" | tail -1)
  if [ -n "$ffn" ] && [ $((ffn % 64)) -ne 0 ] && want "$cfg" torch_padded; then
    step "step_torch_padded_$cfg" "$RUNLOG" "${TORCH_ENV[@]}" python3 tools/bench/bench_step_torch.py \
      "${torch_args[@]}" --pad_ffn 64
  fi
done
# One record of the whole run, $OUT/<gpu>-<date>.json (rewritten after every step from
# here on, the tests' verdicts too): commit it as docs/benchmarks/<gpu>-<date>.json
# (tools/device/bench_record.py --tables then regenerates the BENCHMARKS tables).
