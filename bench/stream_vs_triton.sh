#!/usr/bin/env bash
# Streams and sequences against Triton's Python backend, in one run (not run in CI):
#   repeat    repeat_int32: N responses per request over gRPC ModelStreamInfer, at STREAMS
#             streams; tessera's examples/repeat (Wasm, decoupled) vs a Python-backend model
#             with the same contract (bench/triton_models/repeat_int32)
#   sequence  sequence_sum: a running sum per sequence, unary gRPC with sequence_id, at
#             CONCURRENCY; tessera's tests/guests/sequence_sum (Wasm, host-kept implicit
#             state) vs a Python-backend model keeping the sums itself
# Load: perf_analyzer for both (streams: --streaming, zero inputs, so IN has RESPONSES zeros and
# no delays; sequences: --sequence-length LENGTH, zero inputs), and bench/stream_load.py (grpcio,
# one client for both servers) for the gap between consecutive responses of a request, which
# perf_analyzer does not report. Server CPU is the process tree's (Triton's Python models run in
# stub processes).
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
  CONCS="$STREAMS" run_load tessera "$TESSERA_PID" "$T_GRPC" repeat_int32 --streaming --input-data zero \
    --shape IN:"$RESPONSES" --shape DELAY:"$RESPONSES" --shape WAIT:1
  CONCS="$CONCURRENCY" run_load tessera "$TESSERA_PID" "$T_GRPC" sequence_sum --sequence-length "$LENGTH" --input-data zero
  stop_tessera
fi
if has triton; then
  start_triton "$ROOT/bench/triton_models" triton repeat_int32 sequence_sum
  "${LOAD[@]}" repeat "127.0.0.1:$TR_GRPC" "$TRITON_PID" triton "$STREAMS" --responses "$RESPONSES" --seconds "$SECONDS_EACH" | tee -a "$ROWS"
  CONCS="$STREAMS" run_load triton "$TRITON_PID" "$TR_GRPC" repeat_int32 --streaming --input-data zero \
    --shape IN:"$RESPONSES" --shape DELAY:"$RESPONSES" --shape WAIT:1
  CONCS="$CONCURRENCY" run_load triton "$TRITON_PID" "$TR_GRPC" sequence_sum --sequence-length "$LENGTH" --input-data zero
  stop_triton
fi

{
  echo "stream_load.py (Python grpcio client, $RESPONSES responses per request; p50/p99 are the gaps between consecutive responses as the client reads them):"
  echo
  echo "| server | load | streams | responses/s | gap p50 µs | gap p99 µs | server CPU % | server CPU µs/response |"
  echo "|---|---|---:|---:|---:|---:|---:|---:|"
  cat "$ROWS"
  echo
  echo "perf_analyzer, repeat_int32, gRPC streams ($RESPONSES responses per request; latency is to the first response):"
  echo
  echo "| server | streams | requests/s | responses/s | p50 µs | p99 µs | server CPU % | server CPU µs/response |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|"
  awk -F'\t' -v n="$RESPONSES" '$4 == "repeat_int32" { printf "| %s | %s | %s | %.0f | %s | %s | %s | %.1f |\n", $1, $5, $6, $6 * n, $8, $10, $11, $11 / ($6 * n) * 10000 }' "$OUT_DIR/summary.tsv"
  echo
  echo "perf_analyzer, sequence_sum, gRPC (server CPU µs per step = srvCPU% / steps/s):"
  echo
  echo "| server | conc | steps/s | p50 µs | p99 µs | server CPU % | server CPU µs/step |"
  echo "|---|---:|---:|---:|---:|---:|---:|"
  awk -F'\t' '$4 == "sequence_sum" { printf "| %s | %s | %s | %s | %s | %s | %.0f |\n", $1, $5, $6, $8, $10, $11, $11 / $6 * 10000 }' "$OUT_DIR/summary.tsv"
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
    awk -F'\t' '$4 == "repeat_int32" { rate[$1 " " $5] = $6; cpu[$1 " " $5] = $11 / $6 }
      END { for (k in rate) { split(k, p, " "); if (p[1] == "tessera" && rate["triton " p[2]] > 0)
        printf "| repeat (perf_analyzer) | %s | %.2f | %.2f |\n", p[2], rate[k] / rate["triton " p[2]], cpu[k] / cpu["triton " p[2]] } }' "$OUT_DIR/summary.tsv"
    awk -F'\t' '$4 == "sequence_sum" { rate[$1] = $6; cpu[$1] = $11 / $6 }
      END { if (rate["triton"] > 0) printf "| sequence (perf_analyzer) | %s | %.2f | %.2f |\n", "'"$CONCURRENCY"'", rate["tessera"] / rate["triton"], cpu["tessera"] / cpu["triton"] }' "$OUT_DIR/summary.tsv"
  fi
} | tee "$RESULTS/report.md"
