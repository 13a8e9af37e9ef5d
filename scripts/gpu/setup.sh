#!/usr/bin/env bash
# GPU set-up: a second Python venv, .venv-gpu/, with ONNX Runtime's GPU build (onnxruntime-gpu,
# the same release as the CPU wheel the project pins) and the CUDA and cuDNN libraries it loads,
# all from PyPI. The server finds them through scripts/gpu/env.sh. Needs an NVIDIA driver for
# CUDA 13 (nvidia-smi shows "CUDA Version: 13.x") to run, not to install.
#
#   scripts/gpu/setup.sh && source scripts/gpu/env.sh && scripts/serve.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
VERSION="$(sed -n 's/^pub const PINNED_VERSION: &str = "\(.*\)";/\1/p' host/src/backend/onnx/mod.rs)"
PYTHON="${PYTHON:-python3}"
[ -x .venv-gpu/bin/python ] || "$PYTHON" -m venv .venv-gpu
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
# The extras bring the CUDA runtime, cuFFT, cuRAND, NVRTC and cuDNN wheels; the CUDA provider also
# links cuBLAS/cuBLASLt 13, named here. onnx is for bench/gpu_vs_ort.py.
.venv-gpu/bin/python -m pip install -q "onnxruntime-gpu[cuda,cudnn]==$VERSION" "nvidia-cublas~=13.0" numpy onnx
source "$ROOT/scripts/gpu/env.sh"
echo "ORT_DYLIB_PATH=$ORT_DYLIB_PATH"
