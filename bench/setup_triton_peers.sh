#!/usr/bin/env bash
# Prepares the real Triton (../shared/peers/triton) to serve bench/triton_models, the
# Python-backend peers of tessera's models. Idempotent; nothing is downloaded when all is in place.
#
#   bench/setup_triton_peers.sh
#
# 1. runs ../shared/peers/triton/setup.sh when its .venv (tritonserver, perf_analyzer) is missing
# 2. installs onnxruntime (the version tessera pins, see scripts/setup-python.sh) into that .venv
#    when it is not importable there: bench/triton_models/minilm runs it inside Triton's Python
#    backend, whose embedded interpreter uses the .venv's site-packages
# 3. fetches model_repository/minilm/1/model.onnx (scripts/fetch_models.sh, sha256-checked), the
#    ONNX file both servers run
#
# Env: SHARED (../shared next to the repo)  ORT_VERSION (1.31.1)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHARED="${SHARED:-$ROOT/../shared}"
PEER="$(cd "$SHARED/peers/triton" && pwd)"
ORT_VERSION="${ORT_VERSION:-1.31.1}"
VPY="$PEER/.venv/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

if [ ! -x "$VPY" ] || [ ! -x "$PEER/.venv/pa/perf_analyzer/bin/perf_analyzer" ] \
   || ! "$VPY" -c 'import pytriton, tritonclient.http' 2>/dev/null; then
  echo "## setting up the Triton peer ($PEER/setup.sh)" >&2
  "$PEER/setup.sh" >&2
fi

if ! "$VPY" -c 'import numpy, onnxruntime' 2>/dev/null; then
  echo "## installing onnxruntime==$ORT_VERSION into $PEER/.venv" >&2
  "$VPY" -m pip install -q "onnxruntime==$ORT_VERSION" >&2
fi
"$VPY" -c 'import numpy, onnxruntime; print("triton peer venv: numpy", numpy.__version__, "onnxruntime", onnxruntime.__version__)' >&2

"$ROOT/scripts/fetch_models.sh" >&2
[ -f "$ROOT/model_repository/minilm/1/model.onnx" ] || { echo "model_repository/minilm/1/model.onnx missing" >&2; exit 1; }
[ -f "$ROOT/examples/preprocess_text/vocab.txt" ] || { echo "examples/preprocess_text/vocab.txt missing" >&2; exit 1; }
