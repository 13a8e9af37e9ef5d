#!/usr/bin/env bash
# Streams and sequences against Triton's Python backend, in one run (not run in CI):
#   repeat    repeat_int32: N responses per request over gRPC ModelStreamInfer, at STREAMS
#             streams; tessera's examples/repeat (Wasm, decoupled) vs a Python-backend model
#             with the same contract (bench/triton_models/repeat_int32)
#   sequence  sequence_sum: a running sum per sequence, unary gRPC with sequence_id, at
#             CONCURRENCY clients; tessera's tests/guests/sequence_sum (Wasm, host-kept implicit
#             state) vs a Python-backend model keeping the sums itself
# Load: bench/stream_load.py (grpcio, the same client for both servers); server CPU is the
# process tree's (Triton's Python models run in stub processes).
#
#   SKIP_BUILD=1 bench/stream_vs_triton.sh
#
# Env: STREAMS (1,4,16)  RESPONSES (1000)  CONCURRENCY (16)  LENGTH (100)  DURATION (5, seconds)
#      SERVERS ("tessera triton")  SKIP_BUILD  TESSERA_BIN  SHARED  RESULTS  ports: bench/lib.sh
set -euo pipefail
# shellcheck source=bench/lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
cd "$ROOT"
PROTO=grpc
STREAMS="${STREAMS:-1,4,16}"
RESPONSES="${RESPONSES:-1000}"
CONCURRENCY="${CONCURRENCY:-16}"
LENGTH="${LENGTH:-100}"
SECONDS_EACH="${DURATION:-5}"
SERVERS="${SERVERS:-tessera triton}"
bench_init stream_vs_triton
echo "streams: $STREAMS x $RESPONSES responses; sequences: $CONCURRENCY x $LENGTH steps; ${SECONDS_EACH}s each" >> "$RESULTS/env.txt"
has() { [[ " $SERVERS " == *" $1 "* ]]; }
LOAD=("$ROOT/.venv/bin/python" "$ROOT/bench/stream_load.py")

has tessera && tessera_prepare
has triton && triton_prepare
REPO="$RESULTS/repo"
mkdir -p "$REPO"
if has tessera; then
  need_wasm "$ROOT/model_repository" repeat_int32
  need_wasm "$ROOT/tests/fixtures/model_repository" sequence_sum
  cp -r "$ROOT/model_repository/repeat_int32" "$REPO/"
  cp -r "$ROOT/tests/fixtures/model_repository/sequence_sum" "$REPO/"
  # Sixteen live sequences, as the Triton peer allows, and no idle release during the run.
  sed -i 's/max_candidate_sequences: 4/max_candidate_sequences: 16/; s/max_sequence_idle_microseconds: 300000/max_sequence_idle_microseconds: 5000000/' \
    "$REPO/sequence_sum/config.pbtxt"
fi

ROWS="$RESULTS/rows.md"
: > "$ROWS"
if has tessera; then
  start_tessera "$REPO" tessera repeat_int32 sequence_sum
  "${LOAD[@]}" repeat "127.0.0.1:$T_GRPC" "$TESSERA_PID" tessera "$STREAMS" --responses "$RESPONSES" --seconds "$SECONDS_EACH" | tee -a "$ROWS"
  "${LOAD[@]}" sequence "127.0.0.1:$T_GRPC" "$TESSERA_PID" tessera "$CONCURRENCY" --length "$LENGTH" --seconds "$SECONDS_EACH" | tee -a "$ROWS"
  stop_tessera
fi
if has triton; then
  start_triton "$ROOT/bench/triton_models" triton repeat_int32 sequence_sum
  "${LOAD[@]}" repeat "127.0.0.1:$TR_GRPC" "$TRITON_PID" triton "$STREAMS" --responses "$RESPONSES" --seconds "$SECONDS_EACH" | tee -a "$ROWS"
  "${LOAD[@]}" sequence "127.0.0.1:$TR_GRPC" "$TRITON_PID" triton "$CONCURRENCY" --length "$LENGTH" --seconds "$SECONDS_EACH" | tee -a "$ROWS"
  stop_triton
fi

{
  echo "| server | load | streams / clients | responses or steps /s | p50 µs (gap or latency) | p99 µs | server CPU % | server CPU µs per response or step |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|"
  cat "$ROWS"
  if has tessera && has triton; then
    echo
    echo "| load | level | tessera/triton per s | tessera/triton CPU per response or step |"
    echo "|---|---:|---:|---:|"
    python3 - "$ROWS" <<'PY'
import sys
rows = {}
for line in open(sys.argv[1]):
    c = [x.strip() for x in line.strip().strip("|").split("|")]
    rows[(c[0], c[1], c[2])] = (float(c[3].replace(",", "")), float(c[7].replace(",", "")))
for (server, load, level), (rate, cpu) in sorted(rows.items()):
    if server != "tessera" or ("triton", load, level) not in rows:
        continue
    t_rate, t_cpu = rows[("triton", load, level)]
    print(f"| {load} | {level} | {rate / t_rate:.2f} | {cpu / t_cpu:.2f} |")
PY
  fi
} | tee "$RESULTS/report.md"
