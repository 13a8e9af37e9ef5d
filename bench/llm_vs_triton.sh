#!/usr/bin/env bash
# Generative serving in one run (not run in CI): SmolLM2-135M-Instruct (Q4_1 GGUF), prompts of
# PROMPT tokens, GENERATED tokens each, at STREAMS concurrent streams, side by side:
#   bare        llama.cpp alone through llama-cpp-2, its own batched loop, no server
#               (target/release/examples/llm_bare bench): the floor
#   tessera     the engine model tensorrt_llm over gRPC ModelStreamInfer (TensorRT-LLM tensors)
#   tessera-openai  POST /v1/completions, streamed: front-end + Wasm BLS handler (tokenizer,
#               detokenizer) + engine
#   tessera-ensemble  TensorRT-LLM's ensemble through generate_stream: Wasm preprocessing, the
#               engine, Wasm postprocessing once per engine response
#   triton      real Triton 2.51, a decoupled Python-backend model.py running the same GGUF through
#               llama-cpp-python per request (bench/triton_models/llm_engine): what users do today
# plus one level with a LONG-token prompt arriving a second into STREAMS_LONG decoding streams.
# Load: bench/llm_load.py (TTFT, inter-token latency, tokens/s, server CPU per token).
#
#   SKIP_BUILD=1 bench/llm_vs_triton.sh
#
# Env: STREAMS (1,4,16)  PROMPT (128)  GENERATED (128)  REQUESTS (2 per stream)
#      LONG (1024)  STREAMS_LONG (8)  SERVERS ("bare tessera triton")  SKIP_BUILD  RESULTS
set -euo pipefail
# shellcheck source=bench/lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
cd "$ROOT"
STREAMS="${STREAMS:-1,4,16}"
PROMPT="${PROMPT:-128}"
GENERATED="${GENERATED:-128}"
REQUESTS="${REQUESTS:-2}"
LONG="${LONG:-1024}"
STREAMS_LONG="${STREAMS_LONG:-8}"
SERVERS="${SERVERS:-bare tessera triton}"
bench_init llm_vs_triton
echo "prompt $PROMPT tokens, $GENERATED generated, streams $STREAMS, $REQUESTS requests per stream" >> "$RESULTS/env.txt"
has() { [[ " $SERVERS " == *" $1 "* ]]; }
GGUF="$ROOT/model_repository/tensorrt_llm/1/model.gguf"
LOAD=("$ROOT/.venv/bin/python" "$ROOT/bench/llm_load.py")
ROWS="$RESULTS/rows.md"
: > "$ROWS"

if has tessera || has bare; then
  tessera_prepare
  [ -f "$GGUF" ] || die "$GGUF missing (scripts/fetch_models.sh)"
fi
if has bare; then
  [ "${SKIP_BUILD:-0}" = 1 ] || (cargo build --release -p tessera --example llm_bare) >&2
  for s in ${STREAMS//,/ }; do
    "$ROOT/target/release/examples/llm_bare" bench "$GGUF" "$s" "$PROMPT" "$GENERATED" \
      | "${LOAD[@]}" bare-row "bare llama.cpp" \
      | tee -a "$ROWS"
  done
fi
if has tessera; then
  start_tessera "$ROOT/model_repository" tessera tensorrt_llm tensorrt_llm_bls ensemble
  "${LOAD[@]}" grpc "127.0.0.1:$T_GRPC" "$TESSERA_PID" tessera tensorrt_llm "$STREAMS" \
    --prompt "$PROMPT" --generated "$GENERATED" --requests "$REQUESTS" | tee -a "$ROWS"
  "${LOAD[@]}" grpc "127.0.0.1:$T_GRPC" "$TESSERA_PID" "tessera, $LONG-token prompt joins" tensorrt_llm \
    "$STREAMS_LONG" --prompt "$PROMPT" --generated "$GENERATED" --requests 1 --long-prompt "$LONG" | tee -a "$ROWS"
  "${LOAD[@]}" openai "127.0.0.1:$T_HTTP" "$TESSERA_PID" tessera-openai tensorrt_llm_bls "$STREAMS" \
    --prompt "$PROMPT" --generated "$GENERATED" --requests "$REQUESTS" --metrics "127.0.0.1:$T_METRICS" \
    --tokenizer "$ROOT/model_repository/tensorrt_llm/1/tokenizer.json" | tee -a "$ROWS"
  "${LOAD[@]}" ensemble "127.0.0.1:$T_HTTP" "$TESSERA_PID" tessera-ensemble ensemble "$STREAMS" \
    --prompt "$PROMPT" --generated "$GENERATED" --requests "$REQUESTS" --metrics "127.0.0.1:$T_METRICS" \
    --tokenizer "$ROOT/model_repository/tensorrt_llm/1/tokenizer.json" | tee -a "$ROWS"
  stop_tessera
fi
if has triton; then
  triton_prepare
  VPY="$PEER/.venv/bin/python"
  if ! "$VPY" -c 'import llama_cpp' 2>/dev/null; then
    # Built from source: GGML_NATIVE would enable llama.cpp's AMX kernels, which crash in some VMs.
    log "installing llama-cpp-python==0.3.36 into $PEER/.venv (builds llama.cpp, minutes)"
    CMAKE_ARGS="-DGGML_NATIVE=OFF" "$VPY" -m pip install -q "llama-cpp-python==0.3.36" >&2
  fi
  echo "triton peer: llama-cpp-python $("$VPY" -c 'import llama_cpp; print(llama_cpp.__version__)')" >> "$RESULTS/env.txt"
  REPO="$RESULTS/triton_repo"
  mkdir -p "$REPO"
  cp -r "$ROOT/bench/triton_models/llm_engine" "$REPO/"
  sed -i "s|GGUF_PATH|$GGUF|" "$REPO/llm_engine/config.pbtxt"
  start_triton "$REPO" triton llm_engine
  # One request per stream: the model serves one request at a time, so 16 streams queue.
  "${LOAD[@]}" grpc "127.0.0.1:$TR_GRPC" "$TRITON_PID" "triton + llama-cpp-python" llm_engine "$STREAMS" \
    --prompt "$PROMPT" --generated "$GENERATED" --requests 1 | tee -a "$ROWS"
  stop_triton
fi

{
  echo "SmolLM2-135M-Instruct Q4_1, prompt $PROMPT tokens, $GENERATED generated per request (bench/llm_load.py):"
  echo
  echo "| system | streams | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | output tokens/s | server CPU µs/token | outside the engine µs/token |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
  cat "$ROWS"
} | tee "$RESULTS/summary.md"
