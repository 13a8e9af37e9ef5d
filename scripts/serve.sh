#!/usr/bin/env bash
# The README's run command: prepares the machine, builds tessera (release) with its Wasm
# handlers and functions, and serves model_repository/ on the tritonserver ports (HTTP 8000) and
# the functions of functions/ at /v1/functions/<name>/.
# Extra arguments go to tessera, e.g. `scripts/serve.sh --http-port 9000`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/prepare.sh
export ORT_DYLIB_PATH="$(scripts/ort-dylib-path.sh)"
exec cargo run --release --bin tessera -- --model-repository model_repository --functions functions "$@"
