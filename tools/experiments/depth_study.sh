#!/usr/bin/env bash
# A reproducible mini curse-of-depth study on the CPU (about 8 minutes on 2 cores):
# trains 12-layer Pre-LN, LNS, Post-LN and Mix-LN models on the default corpus with
# depth diagnostics, then runs the layer-removal sweep and the diagnostics on the
# validation data, draws the figures and writes a Markdown summary.
#   bash tools/experiments/depth_study.sh [OUT_DIR]     (default runs/depth_study)
# Environment: STEPS (default 800), SCHEMES (default "pre lns post mix").
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-runs/depth_study}
STEPS=${STEPS:-800}
SCHEMES=${SCHEMES:-pre lns post mix}
source launch/env.sh

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target lns_train lns_eval >/dev/null
if [ ! -f data/fortunes.train.tok ]; then
  FORTUNES=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
  # shellcheck disable=SC2086
  python3 tools/prepare_data.py --input $FORTUNES --doc_sep fortune --val_fraction 0.02 --out data/fortunes
fi

# 12 blocks of width 64: deep and narrow, so depth effects have room to show.
MODEL="--flagfile=configs/tiny_lns.flags --num_layers=12 --hidden_size=64 --num_heads=4 --num_kv_heads=4
       --intermediate_size=176 --steps=$STEPS --warmup_steps=$((STEPS / 10)) --lr=2e-3 --eval_every=0
       --eval_tokens=16384 --diag_every=50 --log_every=100"
for scheme in $SCHEMES; do
  extra=""
  [ "$scheme" = mix ] && extra="--post_layers=3"  # the paper's 25% Post-LN layers
  echo "== train $scheme"
  rm -rf "$OUT/$scheme"
  # shellcheck disable=SC2086
  ./build/lns_train $MODEL --norm_scheme="$scheme" $extra --out_dir="$OUT/$scheme" 2>&1 | grep -E "^\[.*(step +$STEPS/|eval +step)|error" || true
  ckpt=$(ls -d "$OUT/$scheme"/checkpoints/step_* | tail -1)
  echo "== evaluate $scheme ($ckpt)"
  ./build/lns_eval --checkpoint="$ckpt" --data=data/fortunes.val.tok --seq_len=128 --micro_batch_size=8 \
    --eval_tokens=16384 --drop_layers=sweep --diag --out="$OUT/$scheme/eval" --plot=false | grep -E "perplexity|sweep of"
done

runs=""; evals=""
for scheme in $SCHEMES; do runs="$runs $OUT/$scheme"; evals="$evals $OUT/$scheme/eval.json"; done
# shellcheck disable=SC2086
python3 tools/plot_metrics.py $runs --out "$OUT/loss.png"
# shellcheck disable=SC2086
python3 tools/plot_layer_drop.py $evals --out "$OUT/layer_drop.png"
# shellcheck disable=SC2086
python3 tools/plot_depth.py $evals --out "$OUT/depth_variance.png"
python3 tools/plot_depth.py "$OUT/pre" "$OUT/lns" --out "$OUT/angular.png"
# shellcheck disable=SC2086
python3 tools/experiments/depth_report.py $evals > "$OUT/summary.md"
cat "$OUT/summary.md"
echo "depth_study: figures and summary in $OUT"
