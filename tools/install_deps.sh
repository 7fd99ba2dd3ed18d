#!/usr/bin/env bash
# Installs every build and test dependency of lns from Debian packages.
# Idempotent: packages already present are not downloaded again, and
# `apt-get update` runs only when something is missing.
set -euo pipefail

PKGS=(cmake g++ make ccache pkg-config
      libopenmpi-dev openmpi-bin
      libgoogle-glog-dev libgflags-dev libabsl-dev
      libopenblas-dev libgtest-dev nlohmann-json3-dev
      libprotobuf-dev protobuf-compiler libboost-dev
      python3 fortunes fortunes-min
      developers-reference)  # a slice of the real corpus for the width-512 pipeline test (test_scale_pipeline.py)

# Python packages for the tools: tokenizers and sentencepiece (prepare_data.py),
# matplotlib (plots); tensorboard (`tensorboard --logdir` watches a run, and
# tests/python/test_tensorboard.py reads the event files back with its loaders); cuobjdump and
# nvdisasm (tools/perf/sass_check.py: the CUDA toolkit here lacks them, NVIDIA's PyPI
# wheels carry them). Installed with pip only when missing.
install_python_deps() {
  local py=${PYTHON:-python3}
  if ! "$py" -c "import tokenizers, sentencepiece, matplotlib" 2>/dev/null; then
    echo "[install_deps] pip installing tokenizers sentencepiece matplotlib"
    "$py" -m pip install -q --disable-pip-version-check tokenizers sentencepiece matplotlib \
      || echo "[install_deps] warning: pip install failed; tokenizer tests will skip, plots need matplotlib"
  fi
  if ! "$py" -c "import tensorboard" 2>/dev/null; then
    echo "[install_deps] pip installing tensorboard"
    "$py" -m pip install -q --disable-pip-version-check tensorboard \
      || echo "[install_deps] warning: pip install failed; the tensorboard test will skip"
  fi
  if ! command -v cuobjdump >/dev/null && ! "$py" -c "import nvidia, glob, os, sys; \
      sys.exit(not any(glob.glob(os.path.join(r, '*', 'bin', 'cuobjdump')) for r in nvidia.__path__))" 2>/dev/null; then
    echo "[install_deps] pip installing nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm"
    "$py" -m pip install -q --disable-pip-version-check nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm \
      || echo "[install_deps] warning: pip install failed; the sass tests will skip"
  fi
}

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "[install_deps] all ${#PKGS[@]} Debian packages present"
  install_python_deps
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "[install_deps] installing: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
install_python_deps
echo "[install_deps] done"
