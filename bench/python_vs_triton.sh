#!/usr/bin/env bash
# Triton's add_sub model.py, unchanged, in Triton and in Tessera, with Triton's own perf_analyzer
# (not run in CI): examples/triton-python/repository/add_sub (model.py and config.pbtxt byte for
# byte from python_backend's examples/add_sub) served by
#   triton   the real Triton 2.51, its Python backend (one stub process per instance)
#   tessera  the same folder after `tessera build` (componentize-py; the model.py runs in the
#            Wasm sandbox on Tessera's pb_utils)
# One server at a time, REPS times, at CONCS, over PROTO; SERVER_PID is set so the server's CPU
# (process tree, the Python stub included) is sampled.
#
#   SKIP_BUILD=1 bench/python_vs_triton.sh            # PROTO=grpc for gRPC
#
# Env: CONCS (1,16)  REPS (1)  PROTO (http)  MEASUREMENT_MS STABILITY MAX_TRIALS  SKIP_BUILD
#      TESSERA_BIN  RESULTS  ports: see bench/lib.sh
set -euo pipefail
# shellcheck source=bench/lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
cd "$ROOT"
CONCS="${CONCS:-1,16}"
REPS="${REPS:-1}"
bench_init python_vs_triton
echo "concurrency: $CONCS  reps: $REPS" >> "$RESULTS/env.txt"
tessera_prepare
ensure_perf_analyzer
triton_prepare

SOURCE="$ROOT/examples/triton-python/repository/add_sub"
for side in tessera triton; do
  mkdir -p "$RESULTS/$side-repository/add_sub/1"
  cp "$SOURCE/config.pbtxt" "$RESULTS/$side-repository/add_sub/"
  cp "$SOURCE/1/model.py" "$RESULTS/$side-repository/add_sub/1/"
done
[ -x "$ROOT/.venv/bin/componentize-py" ] || die "componentize-py missing: run scripts/setup-python.sh"
"$TESSERA_BIN" build "$RESULTS/tessera-repository/add_sub" \
  --componentize-py "$ROOT/.venv/bin/componentize-py" >&2
cmp -s "$SOURCE/1/model.py" "$RESULTS/triton-repository/add_sub/1/model.py" \
  && cmp -s "$SOURCE/1/model.py" "$RESULTS/tessera-repository/add_sub/1/model.py" \
  || die "the model.py served is not the upstream one"

for rep in $(seq 1 "$REPS"); do
  start_tessera "$RESULTS/tessera-repository" "tessera-rep$rep" add_sub
  run_load tessera "$TESSERA_PID" "$T_PORT" add_sub
  stop_tessera
  start_triton "$RESULTS/triton-repository" "triton-rep$rep" add_sub
  run_load triton "$TRITON_PID" "$TR_PORT" add_sub
  stop_triton
done

python3 "$ROOT/bench/report.py" python_model "$OUT_DIR/summary.tsv" proto="$PROTO" | tee "$RESULTS/report.md"
log "raw perf_analyzer output and logs: $RESULTS"
