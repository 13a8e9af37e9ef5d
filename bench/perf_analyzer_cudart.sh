#!/usr/bin/env bash
# The peer's perf_analyzer with a CUDA runtime on its library path: its shared-memory code loads
# libcudart.so even for `--shared-memory system`, and fails without one. The runtime is PyPI's
# nvidia-cuda-runtime-cu12 (loading it needs no GPU), unpacked once into
# target/bench-tools/cudart. All arguments are passed through.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEER="${SHARED:-$ROOT/../shared}/peers/triton"
LIB="$ROOT/target/bench-tools/cudart/nvidia/cuda_runtime/lib"
if [ ! -e "$LIB/libcudart.so" ]; then
  mkdir -p "$ROOT/target/bench-tools/cudart"
  (cd "$ROOT/target/bench-tools/cudart" &&
    "$ROOT/.venv/bin/python" -m pip download -q --no-deps "nvidia-cuda-runtime-cu12==12.9.79" -d . &&
    "$ROOT/.venv/bin/python" -m zipfile -e nvidia_cuda_runtime_cu12-*.whl . &&
    ln -sf libcudart.so.12 "$LIB/libcudart.so") >&2
fi
PA="$PEER/.venv/pa/perf_analyzer/bin/perf_analyzer"
G="$PEER/.venv/pa_glibc"
if [ -e "$G/ld-linux-x86-64.so.2" ]; then
  exec "$G/ld-linux-x86-64.so.2" --library-path "$G:$LIB:/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu" "$PA" "$@"
else
  LD_LIBRARY_PATH="$LIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$PA" "$@"
fi
