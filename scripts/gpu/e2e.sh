#!/usr/bin/env bash
# GPU end-to-end check, on a machine with an NVIDIA GPU: builds tessera (unless TESSERA_BIN names
# a binary), starts it on a repository with each model twice, once on the GPU (KIND_GPU) and once
# on the CPU, sends the same inputs to both, requires the answers to agree within tolerance, and
# reads the GPU metrics. Prints what it checked; exits non-zero at the first failure.
#
#   scripts/gpu/setup.sh && scripts/gpu/e2e.sh
#
# ONNX Runtime: the GPU build from scripts/gpu/env.sh (.venv-gpu/), or ORT_DYLIB_PATH and
# LD_LIBRARY_PATH set by the caller. Models: add_sub and minilm from model_repository/
# (scripts/fetch_models.sh fetches minilm), and mlp_classifier_batched.
#
# GPU_KIND=KIND_CPU checks the script itself on a machine without a GPU: the "GPU" copies run on
# the CPU too, and the GPU metrics are not read.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
if [ -z "${ORT_DYLIB_PATH:-}" ]; then source scripts/gpu/env.sh; fi
if [ -z "${TESSERA_BIN:-}" ]; then
  cargo build --release --bin tessera
  TESSERA_BIN="$ROOT/target/release/tessera"
fi
PY="${PYTHON:-python3}"
WORK="$(mktemp -d)"
SERVER=
trap 'if [ -n "$SERVER" ]; then kill "$SERVER" 2>/dev/null; wait "$SERVER" 2>/dev/null; fi; rm -rf "$WORK"' EXIT
REPO="$WORK/repo"
mkdir -p "$REPO"
for model in add_sub minilm mlp_classifier_batched; do
  [ -f "model_repository/$model/1/model.onnx" ] || { echo "missing model_repository/$model (run scripts/fetch_models.sh)"; exit 1; }
  for where in gpu cpu; do
    name="${model}_$where"
    mkdir -p "$REPO/$name/1"
    cp model_repository/$model/1/model.onnx "$REPO/$name/1/"
    cp model_repository/$model/*.txt "$REPO/$name/" 2>/dev/null || true
    kind="${GPU_KIND:-KIND_GPU}"; [ "$where" = cpu ] && kind=KIND_CPU
    # The example's configuration, renamed, with its instance groups replaced.
    "$PY" - <<PY > "$REPO/$name/config.pbtxt"
import re
text = open("model_repository/$model/config.pbtxt").read()
text = re.sub(r'name: "$model"', 'name: "$name"', text, count=1)
cut = text.find("instance_group")
text = (text[:cut] if cut >= 0 else text) + "\ninstance_group [{ kind: $kind count: 1 }]\n"
print(text)
PY
  done
done
PORT="${PORT:-18000}"
"$TESSERA_BIN" --model-repository "$REPO" --http-port "$PORT" --metrics-port $((PORT + 2)) \
  --grpc-port $((PORT + 1)) --strict-readiness=true > "$WORK/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 1 600); do
  curl -sf "localhost:$PORT/v2/health/ready" > /dev/null && break
  kill -0 "$SERVER" 2>/dev/null || { cat "$WORK/server.log"; echo "FAIL: the server stopped"; exit 1; }
  sleep 0.5
done
curl -sf "localhost:$PORT/v2/health/ready" > /dev/null || { cat "$WORK/server.log"; echo "FAIL: not ready"; exit 1; }
grep -E "GPU [0-9]+:|ONNX Runtime session on the GPU" "$WORK/server.log" || true
"$PY" - "$PORT" <<'PY'
import json, random, sys, urllib.request
port = int(sys.argv[1])
def call(path, body=None):
    req = urllib.request.Request(f"http://localhost:{port}{path}", data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())
random.seed(7)
def outputs(model, inputs):
    return {o["name"]: o["data"] for o in call(f"/v2/models/{model}/infer", {"inputs": inputs})["outputs"]}
cases = {
    "add_sub": [[{"name": n, "shape": [4, 16], "datatype": "FP32", "data": [random.uniform(-1, 1) for _ in range(64)]} for n in ("INPUT0", "INPUT1")]],
    "mlp_classifier_batched": [],
    "minilm": [],
}
for model in ("mlp_classifier_batched", "minilm"):
    meta = call(f"/v2/models/{model}_cpu")
    inputs = []
    for t in meta["inputs"]:
        shape = [2 if d == -1 and i == 0 else (8 if d == -1 else d) for i, d in enumerate(t["shape"])]
        n = 1
        for d in shape: n *= d
        if t["datatype"] == "FP32":
            data = [random.uniform(-1, 1) for _ in range(n)]
        else:  # token ids and masks
            data = [random.randint(1, 1000) if "ids" in t["name"] and "type" not in t["name"] else 1 for _ in range(n)]
            if "type" in t["name"]: data = [0] * n
        inputs.append({"name": t["name"], "shape": shape, "datatype": t["datatype"], "data": data})
    cases[model].append(inputs)
worst = 0.0
for model, runs in cases.items():
    for inputs in runs:
        gpu, cpu = outputs(f"{model}_gpu", inputs), outputs(f"{model}_cpu", inputs)
        for name in cpu:
            diff = max(abs(float(a) - float(b)) for a, b in zip(gpu[name], cpu[name]))
            scale = max(1.0, max(abs(float(b)) for b in cpu[name]))
            worst = max(worst, diff / scale)
            ok = diff <= 1e-3 * scale
            print(f"{'ok  ' if ok else 'FAIL'} {model}: output {name}, {len(cpu[name])} values, max |gpu - cpu| = {diff:.2e}")
            if not ok: sys.exit(1)
# Batches: concurrent requests of 1 to 3 rows, which the batcher joins into one input per batch,
# then one request larger than any batch before.
from concurrent.futures import ThreadPoolExecutor
def rows(n, seed):
    rng = random.Random(seed)
    return [{"name": "INPUT", "shape": [n, 64], "datatype": "FP32", "data": [rng.uniform(-1, 1) for _ in range(n * 64)]}]
def compare(args):
    n, seed = args
    inputs = rows(n, seed)
    gpu, cpu = outputs("mlp_classifier_batched_gpu", inputs), outputs("mlp_classifier_batched_cpu", inputs)
    return max(abs(float(a) - float(b)) for a, b in zip(gpu["PROBS"], cpu["PROBS"]))
with ThreadPoolExecutor(32) as pool:
    diffs = list(pool.map(compare, [(1 + i % 3, i) for i in range(256)]))
stats = call("/v2/models/mlp_classifier_batched_gpu/stats")["model_stats"][0]
batches = [int(b["batch_size"]) for b in stats["batch_stats"]]
diffs.append(compare((64, 999)))
print(f"{'ok  ' if max(diffs) <= 1e-3 else 'FAIL'} mlp_classifier_batched: {len(diffs)} concurrent requests, batch sizes {min(batches)}..{max(batches)}, max |gpu - cpu| = {max(diffs):.2e}")
if max(diffs) > 1e-3: sys.exit(1)
if max(batches) < 4: print("note: the batcher formed no batch of 4 or more rows; joining requests was not exercised")
print(f"GPU answers agree with the CPU's (worst relative difference {worst:.2e}, tolerance 1e-3)")
PY
if [ "${GPU_KIND:-KIND_GPU}" != KIND_GPU ]; then echo "PASS (GPU_KIND=$GPU_KIND: no GPU metrics read)"; exit 0; fi
METRICS="$(curl -sf "localhost:$((PORT + 2))/metrics")" || { echo "FAIL: /metrics did not answer"; exit 1; }
for family in nv_gpu_utilization nv_gpu_memory_total_bytes nv_gpu_memory_used_bytes nv_gpu_power_usage nv_gpu_power_limit nv_energy_consumption; do
  line="$(grep "^$family{gpu_uuid=" <<<"$METRICS" | head -1 || true)"
  [ -n "$line" ] || { echo "FAIL: no $family on /metrics"; exit 1; }
  echo "ok   $line"
done
echo "PASS: GPU end to end"
