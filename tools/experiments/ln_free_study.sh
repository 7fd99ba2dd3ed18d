#!/usr/bin/env bash
# The LN-free study on the CPU (docs/ln_free.md; minutes on 2 cores): pre-trains a small
# Pre-LN and a small LNS model on the fortunes corpus, then fine-tunes each twice from
# its checkpoint for the same steps on the same data: once with the --ln_free recipe
# (MLP pre-norms, attention pre-norm for q/k, for v with the end-of-text case, the final
# norm, then the two special cases dropped, each after the loss is back within TOL of
# the baseline or after CAP steps), once untouched (the control). Writes the four
# runs, a Markdown summary (loss before, the bump at each replacement, the final gap)
# and the plot. Each LN-free model ends with every norm one constant, so it is then folded
# (lns_convert fold-norms: no norms left) and the folded model evaluated (lns_eval): the
# same validation loss as the LN-free checkpoint it came from.
#   nice -n 19 bash tools/experiments/ln_free_study.sh [OUT_DIR]   (default runs/ln_free_study)
# Environment: PRETRAIN (default 300 steps), FINETUNE (default 260), EVAL_EVERY (default 20),
# FT_LR (default 5e-4, constant while fine-tuning), TOL (0.03), CAP (40), WAIT (20: steps
# of plain fine-tuning before the first replacement), LAYERS (6), SEED (1234: the
# initialisation and the data order), RECORD (docs/ln_free_runs/seed$SEED.json, kept in git;
# empty: none), DOC (docs/ln_free.md: its tables rewritten from every record in RECORD's
# folder, and its figure; empty: neither). The page's runs: the defaults, seeds 1234-1236.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-runs/ln_free_study}
PRETRAIN=${PRETRAIN:-300}
FINETUNE=${FINETUNE:-260}
EVAL_EVERY=${EVAL_EVERY:-20}
FT_LR=${FT_LR:-5e-4}
TOL=${TOL:-0.03}
CAP=${CAP:-40}
WAIT=${WAIT:-20}
LAYERS=${LAYERS:-6}
SEED=${SEED:-1234}
RECORD=${RECORD-docs/ln_free_runs/seed$SEED.json}
DOC=${DOC-docs/ln_free.md}
START=$(date +%s)
source launch/env.sh
# One OpenMP thread: on a shared machine, spinning OpenMP barriers cost far more than they give.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target lns_train lns_eval lns_convert >/dev/null
if [ ! -f data/fortunes.train.tok ]; then
  FORTUNES=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
  # shellcheck disable=SC2086
  python3 tools/prepare_data.py --input $FORTUNES --doc_sep fortune --val_fraction 0.02 --out data/fortunes
fi
rm -rf "$OUT"
mkdir -p "$OUT"

TOTAL=$((PRETRAIN + FINETUNE))
MODEL="--flagfile=configs/tiny_lns.flags --num_layers=$LAYERS --hidden_size=64 --num_heads=4 --num_kv_heads=4
       --intermediate_size=176 --eval_tokens=8192 --log_every=100 --seed=$SEED"
EVAL="--data=data/fortunes.val.tok --seq_len=128 --micro_batch_size=8 --eval_tokens=8192 --plot=false"
# The recipe; 256 is the byte tokenizer's end-of-document id (tools/prepare_data.py).
T="~$TOL/$CAP"
SCHEDULE="mlp@+$WAIT,attn_qk@$T,attn_v:eot@$T,final@$T,drop_eot@$T,drop_pos0@$T"
LN_FREE="--ln_free=$SCHEDULE --ln_free_eot_token=256 --ln_free_calib_tokens=8192 --ln_free_loss_window=10"
echo "schedule: $SCHEDULE" | tee "$OUT/schedule.txt"

for arm in pre lns; do
  echo "== pre-train $arm for $PRETRAIN steps"
  # shellcheck disable=SC2086
  ./build/lns_train $MODEL --norm_scheme=$arm --steps=$PRETRAIN --warmup_steps=$((PRETRAIN / 10)) --lr=2e-3 \
    --eval_every=0 --out_dir="$OUT/pretrain_$arm" 2>&1 | grep -E "error|saved checkpoint" || true
  ckpt=$(ls -d "$OUT/pretrain_$arm"/checkpoints/step_* | tail -1)
  # shellcheck disable=SC2086
  ./build/lns_eval --checkpoint="$ckpt" $EVAL --out="$OUT/eval_pretrained_$arm" | grep -E "perplexity"
  for run in lnfree control; do
    extra=""
    [ "$run" = lnfree ] && extra="$LN_FREE"
    echo "== fine-tune $arm ($run) for $FINETUNE steps"
    # shellcheck disable=SC2086
    ./build/lns_train $MODEL --norm_scheme=$arm --steps=$TOTAL --resume="$ckpt" --eval_every=$EVAL_EVERY \
      --lr=$FT_LR --min_lr_ratio=1 --warmup_steps=0 $extra \
      --out_dir="$OUT/${run}_$arm" 2>&1 | grep -E "error|ln_free: event" || true
  done
  ck=$(ls -d "$OUT/lnfree_$arm"/checkpoints/step_* | tail -1)
  # shellcheck disable=SC2086
  ./build/lns_eval --checkpoint="$ck" $EVAL --out="$OUT/eval_lnfree_$arm" | grep -E "perplexity|LN-free"
  echo "== fold the norms of the LN-free $arm model and evaluate it"
  ./build/lns_convert fold-norms --in="$ck" --out="$OUT/folded_$arm" | sed -n 1p  # all of its output read: no SIGPIPE under pipefail
  # shellcheck disable=SC2086
  ./build/lns_eval --checkpoint="$OUT/folded_$arm" $EVAL --out="$OUT/eval_folded_$arm" | grep -E "perplexity"
done

python3 tools/plot_metrics.py "$OUT/lnfree_pre" "$OUT/control_pre" "$OUT/lnfree_lns" "$OUT/control_lns" \
  --smooth 10 --out "$OUT/ln_free_study.png"
python3 tools/experiments/ln_free_report.py "$OUT" --config "$PRETRAIN $FINETUNE $EVAL_EVERY $FT_LR $TOL $CAP $WAIT $LAYERS" \
  --seconds $(( $(date +%s) - START )) ${RECORD:+--record "$RECORD"} > "$OUT/summary.md"
cat "$OUT/summary.md"
if [ -n "$RECORD" ] && [ -n "$DOC" ]; then
  python3 tools/experiments/ln_free_report.py --records "$(dirname "$RECORD")" --doc "$DOC" \
    --plot docs/images/ln_free_study.png
fi
echo "ln_free_study: summary in $OUT/summary.md, plot in $OUT/ln_free_study.png${RECORD:+, record $RECORD}"
