#!/usr/bin/env bash
# Runs on a GPU machine with no network, from what scripts/gpu/pack.sh gathered in .gpu-pack/:
# unpacks the onnxruntime-gpu wheel once, points the server and the bench at it and at NVIDIA's
# CUDA libraries in python3's site-packages, then runs the GPU checks.
#   bash .gpu-pack/p1/run.sh [e2e|bench|all]      (default: all)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PACK="$ROOT/.gpu-pack"
UNPACKED=/tmp/tessera-gpu/ort
if ! ls "$UNPACKED"/onnxruntime/capi/libonnxruntime.so.1.* > /dev/null 2>&1; then
  mkdir -p /tmp/tessera-gpu
  cat "$PACK"/p*/wheel.part.* > /tmp/tessera-gpu/ort.whl
  python3 -m zipfile -e /tmp/tessera-gpu/ort.whl "$UNPACKED"
  rm /tmp/tessera-gpu/ort.whl
fi
[ -f model_repository/minilm/1/model.onnx ] || cp "$PACK/p2/minilm.onnx" model_repository/minilm/1/model.onnx
SITE="$(python3 -c 'import site; print(site.getsitepackages()[0])')"
ORT_DYLIB_PATH="$(ls "$UNPACKED"/onnxruntime/capi/libonnxruntime.so.1.* | head -1)"
for lib in "$SITE"/nvidia/*/lib /usr/local/cuda/lib64; do
  [ -d "$lib" ] && LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export ORT_DYLIB_PATH LD_LIBRARY_PATH TESSERA_BIN="$PACK/p1/tessera" PYTHONPATH="$UNPACKED"
nvidia-smi -L || true
case "${1:-all}" in
  e2e) scripts/gpu/e2e.sh ;;
  bench)
    python3 bench/gpu_vs_ort.py --model model_repository/minilm --concurrency 1,4,16,64
    python3 bench/gpu_vs_ort.py --wide-mlp 4096 --concurrency 1,4,16,64 ;;
  all) "$0" e2e && "$0" bench ;;
  *) echo "usage: run.sh [e2e|bench|all]" >&2; exit 2 ;;
esac
