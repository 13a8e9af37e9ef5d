#!/usr/bin/env bash
# add_sub three ways in one run, with Triton's own perf_analyzer (not run in CI):
#   tessera add_sub       ONNX Runtime        (model_repository/add_sub)
#   tessera add_sub_wasm  Wasm handler        (model_repository/add_sub_wasm)
#   Triton  add_sub       Python backend      (bench/triton_models/add_sub, the real Triton 2.51)
#
#   SKIP_BUILD=1 bench/perf_vs_triton.sh          # use the existing target/release/tessera
#   bench/perf_vs_triton.sh                        # cargo build --release first
#
# 1. builds tessera in release (SKIP_BUILD=1 skips it), prepares models and perf_analyzer
# 2. per repetition (REPS): starts tessera on 127.0.0.1:18000 with ./model_repository, loads
#    add_sub and add_sub_wasm at CONCS, stops it; then starts Triton on 127.0.0.1:18100 with
#    bench/triton_models (explicit model control: add_sub only), loads add_sub, stops it.
#    One server at a time; SERVER_PID is set so the server's CPU (process tree) is sampled.
# 3. prints a markdown table (infer/s, p50, p99, server CPU; medians over REPS) and the ratios
#    wasm/onnx (with the p50 latency the Wasm handler adds per request, in µs) and
#    tessera-wasm/Triton. Raw perf_analyzer output, logs and report.md: bench/results/<time>-perf_vs_triton/
#
# Env: CONCS (1,4,16)  REPS (1)  SERVERS ("tessera triton"; e.g. SERVERS=triton for one side)
#      MEASUREMENT_MS (3000) STABILITY (50) MAX_TRIALS (10)  PROTO (http)  SKIP_BUILD (0)
#      TESSERA_BIN  SHARED  RESULTS  ports: see bench/lib.sh
set -euo pipefail
# shellcheck source=bench/lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
cd "$ROOT"
CONCS="${CONCS:-1,4,16}"
REPS="${REPS:-1}"
SERVERS="${SERVERS:-tessera triton}"
bench_init perf_vs_triton
echo "concurrency: $CONCS  reps: $REPS  servers: $SERVERS" >> "$RESULTS/env.txt"

has() { [[ " $SERVERS " == *" $1 "* ]]; }
has tessera && tessera_prepare
if has triton; then ensure_perf_analyzer; triton_prepare; fi
has tessera && need_wasm "$ROOT/model_repository" add_sub_wasm

for rep in $(seq 1 "$REPS"); do
  if has tessera; then
    start_tessera "$ROOT/model_repository" "tessera-rep$rep" add_sub add_sub_wasm
    run_load tessera "$TESSERA_PID" "$T_PORT" add_sub
    run_load tessera "$TESSERA_PID" "$T_PORT" add_sub_wasm
    stop_tessera
  fi
  if has triton; then
    start_triton "$ROOT/bench/triton_models" "triton-rep$rep" add_sub
    run_load triton "$TRITON_PID" "$TR_PORT" add_sub
    stop_triton
  fi
done

python3 "$ROOT/bench/report.py" add_sub "$OUT_DIR/summary.tsv" proto="$PROTO" | tee "$RESULTS/report.md"
log "raw perf_analyzer output and logs: $RESULTS"
