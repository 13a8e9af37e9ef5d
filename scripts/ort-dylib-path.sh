#!/usr/bin/env bash
# Prints the absolute path of the ONNX Runtime shared library (the file that
# exports OrtGetApiBase) shipped in the onnxruntime wheel of .venv/ (see
# scripts/setup-python.sh). Use it as:  export ORT_DYLIB_PATH="$(scripts/ort-dylib-path.sh)"
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
shopt -s nullglob
CANDIDATES=("$ROOT"/.venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.*)
if [ ${#CANDIDATES[@]} -eq 0 ]; then
  echo "ort-dylib-path: no libonnxruntime.so.* under .venv; run scripts/setup-python.sh" >&2
  exit 1
fi
# Prefer the fully versioned file name (libonnxruntime.so.1.31.1 over libonnxruntime.so.1).
BEST="$(printf '%s\n' "${CANDIDATES[@]}" | awk '{ print length($0) "\t" $0 }' | sort -k1,1nr -k2 | head -1 | cut -f2)"
readlink -f "$BEST"
