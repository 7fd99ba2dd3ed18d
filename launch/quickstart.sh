#!/usr/bin/env bash
# From a fresh clone to a model learning real text on the CPU:
#   installs dependencies, builds lns_train, prepares the default corpus (the English
#   text of Debian's `fortunes` package, byte-level), trains configs/tiny_lns.flags
#   through mpirun, plots the loss, and prints a fortune the model wrote (lns_generate,
#   docs/generation.md). Idempotent: a second run skips what is done
#   (the training resumes from runs/tiny_lns's last checkpoint: --resume=auto).
# Extra arguments go to lns_train, e.g.  bash launch/quickstart.sh --steps=100
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

bash tools/install_deps.sh
# shellcheck source=launch/env.sh
source launch/env.sh

echo "== build"
cmake --preset cpu >/dev/null  # CMakePresets.json: Release, build/
cmake --build build -j"$(nproc)" --target lns_train lns_generate

echo "== data"
if [ ! -f data/fortunes.train.tok ] || [ ! -f data/fortunes.val.tok ]; then
  FORTUNES=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
  [ -n "$FORTUNES" ] || { echo "quickstart: no text in /usr/share/games/fortunes (apt-get install fortunes)" >&2; exit 1; }
  # shellcheck disable=SC2086
  python3 tools/prepare_data.py --input $FORTUNES --doc_sep fortune --val_fraction 0.02 --out data/fortunes
else
  echo "data/fortunes.{train,val}.tok present"
fi

echo "== train (configs/tiny_lns.flags)"
# --bind-to none: one rank uses every core through OpenBLAS threads (the default binds to one)
mpirun -np 1 --bind-to none ./build/lns_train --flagfile=configs/tiny_lns.flags --resume=auto "$@"

echo "== plot"
python3 tools/plot_metrics.py runs/tiny_lns --out runs/tiny_lns/loss.png

python3 - <<'PY'
import json
rows = [json.loads(l) for l in open("runs/tiny_lns/metrics.jsonl")]
train = [r for r in rows if "loss" in r]
val = [r for r in rows if "val_loss" in r]
first = sum(r["loss"] for r in train[:5]) / min(5, len(train))
last = sum(r["loss"] for r in train[-5:]) / min(5, len(train))
print("quickstart: training loss %.3f -> %.3f over %d steps (mean of first/last 5)" % (first, last, len(train)))
if val:
    print("quickstart: validation perplexity %.2f at step %d" % (val[-1]["val_ppl"], val[-1]["step"]))
PY
echo "quickstart: metrics  $ROOT/runs/tiny_lns/metrics.jsonl"
echo "quickstart: config   $ROOT/runs/tiny_lns/config.flags"
echo "quickstart: plot     $ROOT/runs/tiny_lns/loss.png"

# A new document after an end-of-document token, sampled until it ends or reaches the
# 128 positions the model was trained at (configs/tiny_lns.flags --seq_len).
echo "== a fortune by the model (lns_generate)"
./build/lns_generate --checkpoint=runs/tiny_lns --temperature=0.8 --top_p=0.95 --max_new_tokens=127 --seed="$RANDOM"
