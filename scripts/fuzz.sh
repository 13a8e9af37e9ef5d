#!/usr/bin/env bash
# Runs each fuzz target (fuzz/fuzz_targets/) for SECONDS (default 600) with cargo-fuzz on the
# nightly toolchain, one after another, and prints a line per target. A crash leaves its input in
# fuzz/artifacts/<target>/; turn it into a unit test next to the decoder.
#
#     scripts/fuzz.sh 600                    # every target, 10 minutes each
#     scripts/fuzz.sh 60 kserve_request      # one target
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT/fuzz"
SECONDS_EACH="${1:-600}"
shift || true
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
  TARGETS=(kserve_request bytes_elements config_pbtxt grpc_request)
fi
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
for t in "${TARGETS[@]}"; do
  mkdir -p "corpus/$t"
  # Seed the corpus with real inputs so the fuzzer starts from valid requests and configs.
  case "$t" in
    kserve_request)
      printf '\x00{"inputs":[{"name":"x","shape":[2,2],"datatype":"FP32","data":[[1,2],[3,4]]}],"outputs":[{"name":"y","parameters":{"classification":2}}]}' > "corpus/$t/seed-json"
      printf '\x00{"id":"a","parameters":{"priority":1,"binary_data_output":true},"inputs":[{"name":"s","shape":[1],"datatype":"BYTES","data":["h\\u00e9"]}]}' > "corpus/$t/seed-bytes"
      header='{"inputs":[{"name":"s","shape":[2],"datatype":"BYTES","parameters":{"binary_data_size":11}}]}'
      { printf '\x01'; printf "\\x$(printf %02x $((${#header} % 256)))\\x$(printf %02x $((${#header} / 256)))"; printf '%s' "$header"; printf '\x03\x00\x00\x00abc\x00\x00\x00\x00'; } > "corpus/$t/seed-binary"
      ;;
    grpc_request)
      # A ModelInferRequest: model "m", one FP32 input "x" of shape [1] with 4 raw bytes.
      printf '\x0a\x01m\x2a\x0c\x0a\x01x\x12\x04FP32\x1a\x01\x01\x3a\x04\x00\x00\x80\x3f' > "corpus/$t/seed"
      ;;
    bytes_elements)
      printf '\x03\x00\x00\x00abc\x00\x00\x00\x00' > "corpus/$t/seed"
      ;;
    config_pbtxt)
      cp "$ROOT"/crates/core/tests/data/triton-configs/*.pbtxt "corpus/$t/" 2>/dev/null || true
      for c in "$ROOT"/model_repository/*/config.pbtxt; do cp "$c" "corpus/$t/$(basename "$(dirname "$c")").pbtxt"; done
      ;;
  esac
  start=$(date +%s)
  log="$ROOT/fuzz/$t.log"
  if cargo +nightly fuzz run "$t" -- -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -max_len=65536 >"$log" 2>&1; then
    result="clean"
  else
    result="FAILED (see fuzz/$t.log and fuzz/artifacts/$t/)"
  fi
  runs=$(grep -o 'Done [0-9]* runs' "$log" | tail -1 || true)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  echo "$t: $result; $((  $(date +%s) - start )) s; ${runs:-?}; ${cov:-?}"
done
