#!/usr/bin/env bash
# The LLM engine on a GPU against the same engine on the CPU, on one machine (not run in CI; needs
# an NVIDIA GPU and the CUDA build: cargo build --release --features llm-cuda, or the pack of
# scripts/gpu/pack.sh through `scripts/gpu/run-packed.sh llm`). SmolLM2-135M-Instruct Q4_1:
#   1. agreement: greedy output of llm_bare for PROMPTS prompts, GPU vs CPU (quantized kernels
#      differ between the two, so this counts identical outputs and the common prefix; no target)
#   2. bare llama.cpp (llm_bare bench), GPU then CPU, at STREAMS
#   3. tessera's engine model over gRPC (bench/llm_load.py), instance group KIND_GPU and KIND_CPU
#      in one server, at STREAMS
# Prints markdown tables.
#
# Env: TESSERA_BIN (target/cuda/release/tessera)  LLM_BARE (target/cuda/release/examples/llm_bare)
#      STREAMS (1,16)  PROMPT (128)  GENERATED (128)  REQUESTS (2)  PROMPTS (8)  PORT (18200)
#      SKIP_BARE (0; 1 = only part 3)  PREFILL_CHUNK (the GPU model's prefill_chunk_tokens)
#      THREADS (the CPU model's threads)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
TESSERA_BIN="${TESSERA_BIN:-$ROOT/target/cuda/release/tessera}"
LLM_BARE="${LLM_BARE:-$ROOT/target/cuda/release/examples/llm_bare}"
STREAMS="${STREAMS:-1,16}"; PROMPT="${PROMPT:-128}"; GENERATED="${GENERATED:-128}"
REQUESTS="${REQUESTS:-2}"; PROMPTS="${PROMPTS:-8}"; PORT="${PORT:-18200}"
GGUF="$ROOT/model_repository/tensorrt_llm/1/model.gguf"
[ -f "$GGUF" ] || { echo "no $GGUF (scripts/fetch_models.sh)"; exit 1; }
WORK="$(mktemp -d)"
SERVER=
trap 'if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null; fi; rm -rf "$WORK"' EXIT

# llama.cpp's own log goes to bare.log, shown if a run fails.
bare() { "$LLM_BARE" "$@" 2>> "$WORK/bare.log" || { tail -20 "$WORK/bare.log"; exit 1; }; }

if [ "${SKIP_BARE:-0}" != 1 ]; then
echo "### Greedy output, GPU vs CPU ($PROMPTS prompts of 32 tokens, 64 generated)"
python3 -c "
import json
for s in range($PROMPTS):
    print(json.dumps([100 + ((i * 7 + s * 13) % 20000) for i in range(32)]))" > "$WORK/prompts.jsonl"
LLM_GPU=1 bare greedy "$GGUF" 64 < "$WORK/prompts.jsonl" > "$WORK/gpu.jsonl"
bare greedy "$GGUF" 64 < "$WORK/prompts.jsonl" > "$WORK/cpu.jsonl"
python3 - "$WORK/gpu.jsonl" "$WORK/cpu.jsonl" <<'PY'
import json, sys
gpu = [json.loads(l) for l in open(sys.argv[1])]
cpu = [json.loads(l) for l in open(sys.argv[2])]
same = sum(g == c for g, c in zip(gpu, cpu))
def common(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]: n += 1
    return n
prefixes = [common(g, c) for g, c in zip(gpu, cpu)]
print(f"identical outputs: {same} of {len(cpu)}; common prefix per prompt (tokens): {prefixes}")
PY
fi
echo
echo "### Bare llama.cpp and tessera's engine: prompt $PROMPT tokens, $GENERATED generated"
echo "| run | streams | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | output tok/s | server CPU µs/token |"
echo "|---|---|---|---|---|---|---|---|"
if [ "${SKIP_BARE:-0}" != 1 ]; then
for where in gpu cpu; do
  for s in ${STREAMS//,/ }; do
    if [ "$where" = gpu ]; then gpu=1; else gpu=0; fi
    LLM_GPU=$gpu bare bench "$GGUF" "$s" "$PROMPT" "$GENERATED" | python3 bench/llm_load.py bare-row "bare llama.cpp, $where"
  done
done
fi

REPO="$WORK/repo"
for where in gpu cpu; do
  kind=KIND_GPU; [ "$where" = cpu ] && kind=KIND_CPU
  mkdir -p "$REPO/tensorrt_llm_$where/1"
  ln -s "$GGUF" "$REPO/tensorrt_llm_$where/1/model.gguf"
  sed -e "s/^name: \"tensorrt_llm\"/name: \"tensorrt_llm_$where\"/" \
      -e "s/^instance_group .*/instance_group [ { count: 1 kind: $kind } ]/" \
      model_repository/tensorrt_llm/config.pbtxt > "$REPO/tensorrt_llm_$where/config.pbtxt"
  if [ "$where" = gpu ] && [ -n "${PREFILL_CHUNK:-}" ]; then
    sed -i "s/key: \"prefill_chunk_tokens\" value: { string_value: \"[0-9]*\" }/key: \"prefill_chunk_tokens\" value: { string_value: \"$PREFILL_CHUNK\" }/" \
      "$REPO/tensorrt_llm_gpu/config.pbtxt"
  fi
  if [ "$where" = cpu ] && [ -n "${THREADS:-}" ]; then
    echo "parameters: { key: \"threads\" value: { string_value: \"$THREADS\" } }" >> "$REPO/tensorrt_llm_cpu/config.pbtxt"
  fi
done
"$TESSERA_BIN" --model-repository "$REPO" --http-port "$PORT" --grpc-port $((PORT + 1)) \
  --metrics-port $((PORT + 2)) --strict-readiness=true > "$WORK/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 1 240); do
  curl -sf "localhost:$PORT/v2/health/ready" > /dev/null && break
  kill -0 "$SERVER" 2>/dev/null || { tail -30 "$WORK/server.log"; echo "FAIL: the server stopped"; exit 1; }
  sleep 0.5
done
curl -sf "localhost:$PORT/v2/health/ready" > /dev/null || { tail -30 "$WORK/server.log"; echo "FAIL: not ready"; exit 1; }
for where in gpu cpu; do
  label="tessera engine, $where"
  [ "$where" = gpu ] && [ -n "${PREFILL_CHUNK:-}" ] && label="$label, prefill_chunk_tokens $PREFILL_CHUNK"
  [ "$where" = cpu ] && [ -n "${THREADS:-}" ] && label="$label, threads $THREADS"
  python3 bench/llm_load.py grpc "127.0.0.1:$((PORT + 1))" "$SERVER" "$label" "tensorrt_llm_$where" \
    "$STREAMS" --prompt "$PROMPT" --generated "$GENERATED" --requests "$REQUESTS"
done
grep -E "LLM engine (on the GPU|ready)" "$WORK/server.log" | sed 's/\x1b\[[0-9;]*m//g' || true
# A clean stop: SIGTERM, then exit status 0 (the engines free their GPU memory before exiting).
kill -TERM "$SERVER"
status=0; wait "$SERVER" || status=$?
SERVER=
if [ "$status" != 0 ]; then
  tail -20 "$WORK/server.log"; echo "FAIL: the server exited with status $status on SIGTERM"; exit 1
fi
echo "ok   the server stopped cleanly on SIGTERM"
