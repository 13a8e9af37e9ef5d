#!/usr/bin/env bash
# Large tensors four ways in one run, with Triton's perf_analyzer (not run in CI):
#   http       KServe v2 HTTP, binary tensor data
#   http-shm   HTTP, inputs and outputs in system shared memory (--shared-memory system)
#   grpc       gRPC, raw_input_contents / raw_output_contents
#   grpc-shm   gRPC + system shared memory
# on two models: text_orientation (ONNX, FP32 [1, 3, 48, 192], 110,592 input bytes, ~1 ms of
# compute) and identity_1mib (an ONNX Identity on FP32 [262144], 1 MiB in and out, no compute:
# what moving the tensor costs).
#
#   SKIP_BUILD=1 bench/transports.sh
#
# Env: CONCS (1,4,16)  REPS (1)  MEASUREMENT_MS STABILITY MAX_TRIALS  SKIP_BUILD  TESSERA_BIN
#      SHARED  RESULTS  ports: see bench/lib.sh
set -euo pipefail
# shellcheck source=bench/lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
cd "$ROOT"
# perf_analyzer's shared-memory mode needs a CUDA runtime to load, even for system memory.
export PERF_ANALYZER="${PERF_ANALYZER:-$ROOT/bench/perf_analyzer_cudart.sh}"
CONCS="${CONCS:-1,4,16}"
REPS="${REPS:-1}"
MODELS=(text_orientation identity_1mib)
bench_init transports
echo "concurrency: $CONCS  reps: $REPS  models: ${MODELS[*]}" >> "$RESULTS/env.txt"

tessera_prepare
ensure_perf_analyzer
REPO="$RESULTS/repo"
mkdir -p "$REPO/identity_1mib/1"
cp -r "$ROOT/model_repository/text_orientation" "$REPO/"
"$ROOT/.venv/bin/python" - "$REPO/identity_1mib" <<'PY'
import sys
from onnx import TensorProto, helper, save
folder = sys.argv[1]
n = 262144
graph = helper.make_graph(
    [helper.make_node("Identity", ["X"], ["Y"])], "identity_1mib",
    [helper.make_tensor_value_info("X", TensorProto.FLOAT, [n])],
    [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [n])])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
save(model, f"{folder}/1/model.onnx")
open(f"{folder}/config.pbtxt", "w").write(
    'name: "identity_1mib"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
    f'input [ {{ name: "X" data_type: TYPE_FP32 dims: [ {n} ] }} ]\n'
    f'output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ {n} ] }} ]\n')
PY
# Output regions: 1 MiB covers the largest output here.
SHM_ARGS=(--shared-memory system --output-shared-memory-size 1048576)

for rep in $(seq 1 "$REPS"); do
  start_tessera "$REPO" "tessera-rep$rep" "${MODELS[@]}"
  for model in "${MODELS[@]}"; do
    PROTO=http run_load http "$TESSERA_PID" "$T_HTTP" "$model"
    PROTO=http run_load http-shm "$TESSERA_PID" "$T_HTTP" "$model" "${SHM_ARGS[@]}"
    PROTO=grpc run_load grpc "$TESSERA_PID" "$T_GRPC" "$model"
    PROTO=grpc run_load grpc-shm "$TESSERA_PID" "$T_GRPC" "$model" "${SHM_ARGS[@]}"
  done
  stop_tessera
done

for model in "${MODELS[@]}"; do
  python3 "$ROOT/bench/report.py" transports "$OUT_DIR/summary.tsv" model="$model"
  echo
done | tee "$RESULTS/report.md"
log "raw perf_analyzer output and logs: $RESULTS"
