#!/usr/bin/env bash
# For a GPU machine with no network: gathers what scripts/gpu/run-packed.sh needs beyond the
# repository into one xz-compressed tar, split into parts of at most 56 MB under .gpu-pack/p<N>/
# (git-ignored), so that each can be carried over on its own:
#   bin/tessera            the release server (stripped), unless LLM_CUDA=1 (then cuda/tessera serves)
#   cuda/                  with LLM_CUDA=1: the server and examples/llm_bare built with the LLM
#                          engine's CUDA backend (--features llm-cuda-no-vmm, target/cuda; a CUDA
#                          toolkit from scripts/gpu/cuda-toolkit.sh) and llama.cpp's shared libraries
#   ort/onnxruntime/       the onnxruntime-gpu wheel's package (the release the project pins), its
#                          CUDA provider cut down to one architecture (prune_fatbin.py, KEEP_SM=90)
#   models/                MiniLM (minilm.onnx) and, with LLM_CUDA=1, the LLM's GGUF
#   wheels/                tritonclient and python-rapidjson (bench/llm_load.py), perf_analyzer
# The GPU machine needs an NVIDIA driver, python3 with numpy and onnx, and NVIDIA's CUDA 13
# libraries (cuBLAS, cudart, cuRAND, cuFFT, cuDNN) in its site-packages, as PyTorch's cu13 wheels
# bring. There, from the repository root:
#
#   bash scripts/gpu/run-packed.sh [e2e|bench|llm|all]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
VERSION="$(sed -n 's/^pub const PINNED_VERSION: &str = "\(.*\)";/\1/p' host/src/backend/onnx/mod.rs)"
PY="${PYTHON:-python3}"
PACK=.gpu-pack
STAGE="$(mktemp -d)"
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$STAGE"/{bin,cuda,models,wheels}
if [ "${LLM_CUDA:-0}" != 1 ]; then  # else the CUDA build is the server
  cargo build --release --bin tessera
  strip -o "$STAGE/bin/tessera" target/release/tessera
fi
[ -f model_repository/minilm/1/model.onnx ] || scripts/fetch_models.sh
cp model_repository/minilm/1/model.onnx "$STAGE/models/minilm.onnx"
if [ "${LLM_CUDA:-0}" = 1 ]; then
  eval "$(scripts/gpu/cuda-toolkit.sh)"
  cargo build --release --target-dir target/cuda --features llm-cuda-no-vmm --bin tessera --example llm_bare
  strip -o "$STAGE/cuda/tessera" target/cuda/release/tessera
  strip -o "$STAGE/cuda/llm_bare" target/cuda/release/examples/llm_bare
  # llama.cpp's shared libraries, by soname, from the build script's output.
  for lib in $(ls -t target/cuda/release/build/llama-cpp-sys-2-*/out/lib/lib*.so.0 | awk -F/ '!seen[$NF]++'); do
    strip --strip-unneeded -o "$STAGE/cuda/$(basename "$lib")" "$lib"
  done
  cp model_repository/tensorrt_llm/1/model.gguf "$STAGE/models/model.gguf"
fi
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$STAGE/download" "onnxruntime-gpu==$VERSION" \
  tritonclient==2.73.0 python-rapidjson==1.25
# perf_analyzer (C++, glibc 2.38+) for bench/gpu_vs_ort.py --load perf_analyzer
"$PY" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_38_x86_64 -d "$STAGE/download" \
  perf-analyzer==2.60.0
mv "$STAGE"/download/tritonclient-*.whl "$STAGE"/download/python_rapidjson-*.whl "$STAGE"/download/perf_analyzer-*.whl "$STAGE/wheels/"
"$PY" -m zipfile -e "$STAGE"/download/onnxruntime_gpu-*.whl "$STAGE/ort"
rm -rf "$STAGE/download" "$STAGE"/ort/onnxruntime_gpu-*.dist-info
PROVIDER="$STAGE/ort/onnxruntime/capi/libonnxruntime_providers_cuda.so"
"$PY" scripts/gpu/prune_fatbin.py "$PROVIDER" "$PROVIDER.pruned" --keep-sm "${KEEP_SM:-90}"
mv "$PROVIDER.pruned" "$PROVIDER"
rm -rf "$PACK"
mkdir -p "$PACK"
tar -C "$STAGE" -cf - bin cuda ort models wheels | xz -T0 -6 | split -b 56M -d -a 2 - "$PACK/part."
n=1
for part in "$PACK"/part.*; do
  mkdir -p "$PACK/p$n"
  mv "$part" "$PACK/p$n/"
  n=$((n + 1))
done
du -sh "$PACK"/p*
