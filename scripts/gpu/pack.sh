#!/usr/bin/env bash
# For a GPU machine with no network: gathers what scripts/gpu/e2e.sh and bench/gpu_vs_ort.py need
# beyond the repository into .gpu-pack/ (git-ignored), in folders of at most 55 MB each, so they can
# be copied over one by one: p1/ the release binary (stripped) and run.sh, p2/ the fetched MiniLM
# model, p3/... the onnxruntime-gpu wheel in parts. The GPU machine needs an NVIDIA driver, python3
# with numpy and onnx, and NVIDIA's CUDA 13 libraries (cuBLAS, cudart, cuRAND; cuDNN for
# convolutions), e.g. from their pip wheels. There, from the repository root:
#
#   bash .gpu-pack/p1/run.sh [e2e|bench|all]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
VERSION="$(sed -n 's/^pub const PINNED_VERSION: &str = "\(.*\)";/\1/p' host/src/backend/onnx/mod.rs)"
PACK=.gpu-pack
rm -rf "$PACK"
mkdir -p "$PACK/p1" "$PACK/p2"
cargo build --release --bin tessera
strip -o "$PACK/p1/tessera" target/release/tessera
cp scripts/gpu/run-packed.sh "$PACK/p1/run.sh"
[ -f model_repository/minilm/1/model.onnx ] || scripts/fetch_models.sh
cp model_repository/minilm/1/model.onnx "$PACK/p2/minilm.onnx"
WHEELS="$(mktemp -d)"
trap 'rm -rf "$WHEELS"' EXIT
"${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 -d "$WHEELS" "onnxruntime-gpu==$VERSION"
split -b 50M -d -a 2 "$WHEELS"/onnxruntime_gpu-*.whl "$WHEELS/wheel.part."
n=3
for part in "$WHEELS"/wheel.part.*; do
  mkdir -p "$PACK/p$n"
  mv "$part" "$PACK/p$n/"
  n=$((n + 1))
done
du -sh "$PACK"/p*
