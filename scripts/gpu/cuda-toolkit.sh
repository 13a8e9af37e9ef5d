#!/usr/bin/env bash
# A CUDA 13.0 toolkit for building (not running) the LLM engine's CUDA backend, assembled from
# NVIDIA's pip wheels (nvcc, nvvm, the runtime's and cuBLAS's headers and libraries) in
# .cache/cuda13, for a machine without NVIDIA's installer or a GPU. Prints the variables the
# build needs; use them as
#
#   eval "$(scripts/gpu/cuda-toolkit.sh)"
#   cargo build --release --features llm-cuda-no-vmm --target-dir target/cuda
#
# The wheels have no driver link stub (libcuda.so), hence `llm-cuda-no-vmm`. CUDAARCHS picks the
# GPU architectures compiled (90: H100/H200; default here; a list like "80;90" for more).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TOOLKIT="$ROOT/.cache/cuda13"
CUDA="$TOOLKIT/nvidia/cu13"
if [ ! -x "$CUDA/bin/nvcc" ]; then
  WHEELS="$ROOT/.cache/cuda13-wheels"
  mkdir -p "$WHEELS" "$TOOLKIT"
  "${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "$WHEELS" \
    "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-cccl==13.0.*" \
    "nvidia-nvvm==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-cublas~=13.0" >&2
  for wheel in "$WHEELS"/*.whl; do "${PYTHON:-python3}" -m zipfile -e "$wheel" "$TOOLKIT" >&2; done
  chmod +x "$CUDA"/bin/* "$CUDA"/nvvm/bin/*
  # CMake's FindCUDAToolkit and the linker look for the unversioned names and lib64/.
  for lib in cudart cublas cublasLt; do ln -sf "lib$lib.so.13" "$CUDA/lib/lib$lib.so"; done
  ln -sfn lib "$CUDA/lib64"
fi
echo "export CUDACXX='$CUDA/bin/nvcc' CUDAToolkit_ROOT='$CUDA' CUDAARCHS='${CUDAARCHS:-90}' LLAMA_BUILD_SHARED_LIBS=1"
