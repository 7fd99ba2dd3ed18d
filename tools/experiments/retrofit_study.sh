#!/usr/bin/env bash
# The LNS retrofit study on the CPU (docs/retrofit.md; a few minutes on 2 cores):
# pre-trains a 12-layer Pre-LN model, converts it with `lns_convert retrofit
# --norm_scheme=lns`, evaluates both, then fine-tunes the retrofitted model and, as the
# control, the untouched Pre-LN model for the same steps on the same data, with a
# validation loss every EVAL_EVERY steps, and writes a Markdown summary and the run's
# record (RECORD, kept in git: the page's tables and figure come from the records only).
#   bash tools/experiments/retrofit_study.sh [OUT_DIR]     (default runs/retrofit_study)
# Environment: PRETRAIN (default 600 steps), FINETUNE (default 200), EVAL_EVERY (default 25),
# FT_LR (default 5e-4, constant while fine-tuning), SEED (1234: the initialisation and the
# data order), RECORD (docs/retrofit_runs/seed$SEED.json; empty: none), DOC (docs/retrofit.md:
# its tables rewritten from every record in RECORD's folder, and its figure; empty: neither).
# The page's runs: PRETRAIN=300 FINETUNE=100 EVAL_EVERY=20, seeds 1234, 1235, 1236.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-runs/retrofit_study}
PRETRAIN=${PRETRAIN:-600}
FINETUNE=${FINETUNE:-200}
EVAL_EVERY=${EVAL_EVERY:-25}
SEED=${SEED:-1234}
RECORD=${RECORD-docs/retrofit_runs/seed$SEED.json}
DOC=${DOC-docs/retrofit.md}
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

# The depth study's model: 12 blocks of width 64, pre-trained with its cosine schedule;
# both fine-tuning arms then run at a constant FT_LR (AdamW state carried over).
TOTAL=$((PRETRAIN + FINETUNE))
FT_LR=${FT_LR:-5e-4}
MODEL="--flagfile=configs/tiny_lns.flags --num_layers=12 --hidden_size=64 --num_heads=4 --num_kv_heads=4
       --intermediate_size=176 --eval_tokens=16384 --log_every=100 --seed=$SEED"
EVAL="--data=data/fortunes.val.tok --seq_len=128 --micro_batch_size=8 --eval_tokens=16384 --plot=false"

echo "== pre-train Pre-LN for $PRETRAIN steps"
# shellcheck disable=SC2086
./build/lns_train $MODEL --norm_scheme=pre --steps=$PRETRAIN --warmup_steps=$((PRETRAIN / 10)) --lr=2e-3 --eval_every=0 \
  --out_dir="$OUT/pretrain" 2>&1 | grep -E "error|saved checkpoint" || true
ckpt=$(ls -d "$OUT/pretrain"/checkpoints/step_* | tail -1)

echo "== retrofit $ckpt to LNS"
./build/lns_convert retrofit --in="$ckpt" --out="$OUT/retrofit" --norm_scheme=lns

echo "== evaluate both"
# shellcheck disable=SC2086
./build/lns_eval --checkpoint="$ckpt" $EVAL --out="$OUT/eval_pre" | grep -E "perplexity"
# shellcheck disable=SC2086
./build/lns_eval --checkpoint="$OUT/retrofit" $EVAL --out="$OUT/eval_retrofit" | grep -E "perplexity"

for arm in lns pre; do
  from=$ckpt
  [ "$arm" = lns ] && from="$OUT/retrofit"
  echo "== fine-tune ($arm) for $FINETUNE steps"
  # shellcheck disable=SC2086
  ./build/lns_train $MODEL --norm_scheme=$arm --steps=$TOTAL --resume="$from" --eval_every=$EVAL_EVERY \
    --lr=$FT_LR --min_lr_ratio=1 --warmup_steps=0 \
    --out_dir="$OUT/finetune_$arm" 2>&1 | grep -E "error|eval +step" || true
done

python3 tools/plot_metrics.py "$OUT/finetune_lns" "$OUT/finetune_pre" --out "$OUT/finetune.png"
python3 tools/experiments/retrofit_report.py "$OUT" --config "$PRETRAIN $FINETUNE $EVAL_EVERY $FT_LR" \
  --seconds $(( $(date +%s) - START )) ${RECORD:+--record "$RECORD"} > "$OUT/summary.md"
cat "$OUT/summary.md"
if [ -n "$RECORD" ] && [ -n "$DOC" ]; then
  python3 tools/experiments/retrofit_report.py --records "$(dirname "$RECORD")" --doc "$DOC" \
    --plot docs/images/retrofit_finetune.png
fi
echo "retrofit_study: summary in $OUT/summary.md${RECORD:+, record $RECORD}"
