#!/usr/bin/env bash
# Dynamic batching on tessera: mlp_classifier (no batching) vs mlp_classifier_batched
# (dynamic_batching; its max_queue_delay_microseconds is read from its config.pbtxt and printed),
# the same ONNX model, with Triton's perf_analyzer (../shared/peers/triton/v2_load.sh).
# Not run in CI.
#
#   SKIP_BUILD=1 bench/batching.sh          # use the existing target/release/tessera
#
# perf_analyzer reads the model config (INPUT FP32 [64], max_batch_size 64) and sends random
# data, one batch-1 request per call; the batched model may merge concurrent calls into one
# ONNX Runtime run.
#
# 1. builds tessera in release (SKIP_BUILD=1 skips it), prepares models and perf_analyzer
# 2. per repetition (REPS): starts tessera on 127.0.0.1:18000 with ./model_repository, runs
#    v2_load.sh for both models at CONCS (1,4,16,64) with SERVER_PID set, stops it
# 3. prints a markdown table (infer/s, p50, p99, server CPU; medians over REPS) and the
#    batched/unbatched ratios at each concurrency.
#    Raw output, logs and report.md: bench/results/<time>-batching/
#
# Env: CONCS (1,4,16,64)  REPS (1)  MEASUREMENT_MS (3000) STABILITY (50) MAX_TRIALS (10)
#      MODEL_REPOSITORY (./model_repository)  PROTO (http)  SKIP_BUILD (0)
#      TESSERA_BIN  SHARED  RESULTS  ports: see bench/lib.sh
set -euo pipefail
# shellcheck source=bench/lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
cd "$ROOT"
CONCS="${CONCS:-1,4,16,64}"
REPS="${REPS:-1}"
REPO="${MODEL_REPOSITORY:-$ROOT/model_repository}"
bench_init batching

tessera_prepare
CFG="$REPO/mlp_classifier_batched/config.pbtxt"
uncommented() { sed 's/#.*//' "$1"; }
uncommented "$CFG" | grep -q 'dynamic_batching' || die "$CFG has no dynamic_batching block"
if uncommented "$REPO/mlp_classifier/config.pbtxt" | grep -q 'dynamic_batching'; then
  die "$REPO/mlp_classifier/config.pbtxt has dynamic_batching: it must be the unbatched baseline"
fi
DELAY="$(uncommented "$CFG" | sed -n 's/.*max_queue_delay_microseconds:[[:space:]]*\([0-9]*\).*/\1/p' | head -1)"
DELAY="${DELAY:-0}"   # a dynamic_batching block without it: Triton's default, 0 µs
PREFERRED="$(uncommented "$CFG" | sed -n 's/.*preferred_batch_size:[[:space:]]*\(.*\)/\1/p' | head -1)"
log "mlp_classifier_batched: max_queue_delay_microseconds $DELAY${PREFERRED:+, preferred_batch_size $PREFERRED}"
echo "concurrency: $CONCS  reps: $REPS  mlp_classifier_batched max_queue_delay_microseconds: $DELAY${PREFERRED:+ preferred_batch_size: $PREFERRED}" >> "$RESULTS/env.txt"

for rep in $(seq 1 "$REPS"); do
  start_tessera "$REPO" "tessera-rep$rep" mlp_classifier mlp_classifier_batched
  for m in mlp_classifier mlp_classifier_batched; do
    run_load tessera "$TESSERA_PID" "$T_PORT" "$m"
  done
  stop_tessera
done

python3 "$ROOT/bench/report.py" batching "$OUT_DIR/summary.tsv" proto="$PROTO" delay_us="$DELAY" | tee "$RESULTS/report.md"
log "raw perf_analyzer output and logs: $RESULTS"
