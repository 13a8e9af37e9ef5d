#!/usr/bin/env bash
# Creates .venv/ at the repository root with the Python tooling Tessera's tests,
# model generators and benchmarks use. Idempotent: re-running only re-checks the
# pins (pip prints nothing when everything is already installed).
#
#   scripts/setup-python.sh            # uses python3 from PATH
#   PYTHON=python3.12 scripts/setup-python.sh
#
# The ONNX Runtime shared library used by the server (ORT_DYLIB_PATH) comes from
# the onnxruntime wheel installed here: see scripts/ort-dylib-path.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
PINS=(
  "onnxruntime==1.31.1"
  "onnx==1.23.2"
  "numpy"
  "tritonclient[http,grpc]==2.73.0"
  "grpcio==1.85.1"
  "pytest==9.2.0"
  "pillow==13.0.0"
  # Triton's image_client.py reads model metadata through it (HTTP).
  "attrdict==2.0.1"
  # An HTTP/2 client that can stop in the middle of a gRPC message (the read-budget tests).
  "h2==4.4.1"
  # The LLM: the GGUF reader that derives the tokenizer, the tokenizer library the tests
  # check against, and the official OpenAI client as the test client.
  "gguf==0.19.0"
  "tokenizers==0.23.3"
  "openai==3.57.0"
  # The TensorRT-LLM guide's client tokenizes with transformers (no torch needed for that).
  "transformers==5.24.0"
  # `tessera build` makes Wasm components of Triton model.py files with it (pinned in
  # host/src/python_build.rs too).
  "componentize-py==0.25.1"
  # deploy/'s Kubernetes manifests are checked against the Kubernetes schemas it carries.
  "kubernetes-validate==1.37.0"
  # The S3-compatible server the shared-store tests run on loopback (it honours conditional
  # writes: If-None-Match: * answers 412 on an existing object).
  "moto[server]==5.2.5"
  # Creates the Azurite container the az:// shared-store tests use.
  "azure-storage-blob==12.31.1"
)

if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
VPY="$ROOT/.venv/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1
"$VPY" -m pip install -q "${PINS[@]}"

# Sanity check: the interpreter can import everything and the ORT dylib exists.
"$VPY" - <<'PY'
import numpy, onnx, onnxruntime, pytest, tritonclient.http, tritonclient.grpc  # noqa: F401
PY
"$ROOT/scripts/ort-dylib-path.sh" > /dev/null
