#!/usr/bin/env bash
# Token files for a GPU call, compressed to fit the 64 MiB the working tree may carry
# (docs/depth_study_scale.md): the real corpus's 53M tokens are 107 MB as they are and
# about 40 MB as xz (token ids of text compress well). The archive goes to
# .gpu-data/<name>.tar.xz (not committed); a call that carries .gpu-data has
# tools/device/run_gpu.sh unpack it into the tree, and later calls on the same warm
# machine find the files there (ignored files stay between calls), so the binaries
# (.gpu-deps) can travel in the next call.
#   bash tools/device/pack_data.sh data/realtext      # PREFIX.{train,val}.tok, PREFIX.json
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
prefix=${1:?usage: pack_data.sh PREFIX (e.g. data/realtext)}
MAX_MIB=${MAX_MIB:-60}
files=()
for s in .train.tok .val.tok .json .tokenizer.json; do
  [ -f "$prefix$s" ] && files+=("$prefix$s")
done
[ -f "$prefix.train.tok" ] && [ -f "$prefix.val.tok" ] ||
  { echo "pack_data: $prefix.train.tok and $prefix.val.tok are needed (tools/experiments/real_corpus.py)" >&2; exit 1; }
mkdir -p .gpu-data
out=.gpu-data/$(basename "$prefix").tar.xz
tar cf - "${files[@]}" | xz -T0 -6 > "$out.tmp"
mib=$(( $(stat -c %s "$out.tmp") / 1048576 ))
if [ "$mib" -gt "$MAX_MIB" ]; then
  rm -f "$out.tmp"
  echo "pack_data: $out would be $mib MiB, over MAX_MIB=$MAX_MIB (a call carries 64 MiB)" >&2
  exit 1
fi
mv "$out.tmp" "$out"
echo "pack_data: $out, $mib MiB: ${files[*]}"
