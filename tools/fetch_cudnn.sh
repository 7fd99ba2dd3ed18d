#!/usr/bin/env bash
# The headers that src/cuda/cudnn/sdpa_cudnn.cpp compiles against (cuDNN's fused
# attention, --attention=cudnn), from the two PyPI wheels NVIDIA publishes, into
# third_party/cudnn/include (not committed; CMake looks there). The library itself is
# not needed to build: it is loaded at run time, and the GPU machines have it in
# PyTorch's environment (tools/device/run_gpu.sh finds it).
#
# Pinned: the cuDNN headers are the oldest 9.x for CUDA 13 on PyPI, so a binary built
# against them runs on that version and every later one (cuDNN keeps its ABI within a
# major); the frontend is header-only and checks the loaded library's version itself.
set -euo pipefail
cd "$(dirname "$0")/.."
CUDNN_VERSION=${CUDNN_VERSION:-9.13.0.50}
FRONTEND_VERSION=${FRONTEND_VERSION:-1.32.0}
dest=third_party/cudnn
if [ -f "$dest/include/cudnn_frontend.h" ] && [ -f "$dest/include/cudnn.h" ] &&
   grep -qx "$CUDNN_VERSION $FRONTEND_VERSION" "$dest/VERSIONS" 2>/dev/null; then
  echo "fetch_cudnn: $dest has cuDNN $CUDNN_VERSION and frontend $FRONTEND_VERSION headers"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pip=(python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp
     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d "$tmp")
"${pip[@]}" "nvidia-cudnn-cu13==$CUDNN_VERSION" "nvidia-cudnn-frontend==$FRONTEND_VERSION"
rm -rf "$dest" && mkdir -p "$dest/include"
(cd "$tmp" && unzip -q -o nvidia_cudnn_cu13-*.whl 'nvidia/cudnn/include/*' 'nvidia_cudnn_cu13-*.dist-info/licenses/*' &&
 unzip -q -o nvidia_cudnn_frontend-*.whl 'include/*' 'nvidia_cudnn_frontend-*.dist-info/*LICENSE*' 2>/dev/null ||
 unzip -q -o nvidia_cudnn_frontend-*.whl 'include/*')
cp -r "$tmp"/nvidia/cudnn/include/. "$dest/include/"
cp -r "$tmp"/include/. "$dest/include/"
find "$tmp" -path '*dist-info*' -iname '*licen*' -type f -exec cp {} "$dest/" \; 2>/dev/null || true
echo "$CUDNN_VERSION $FRONTEND_VERSION" > "$dest/VERSIONS"
echo "fetch_cudnn: cuDNN $CUDNN_VERSION and cudnn-frontend $FRONTEND_VERSION headers in $dest/include"
