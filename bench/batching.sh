#!/usr/bin/env bash
# Dynamic batching on tessera: mlp_classifier (no batching) vs mlp_classifier_batched
# (dynamic_batching, max_queue_delay_microseconds 500), same ONNX model, with
# Triton's perf_analyzer (../shared/peers/triton/v2_load.sh). Not run in CI.
#
#   bench/batching.sh
#
# perf_analyzer reads the model config (INPUT FP32 [64], max_batch_size 64) and
# sends random data, one batch-1 request per call; the batched model may merge
# concurrent calls into one ONNX Runtime run.
#
# 1. builds tessera in release (SKIP_BUILD=1 to skip)
# 2. starts tessera on 127.0.0.1:18000/18001/18002 with ./model_repository
# 3. runs v2_load.sh for both models at CONCS (1,4,16,64), SERVER_PID set
# 4. prints a markdown table and batched/unbatched ratios per concurrency
# tessera is stopped on exit.
#
# Env: CONCS (1,4,16,64)  PROTO (http)  MEASUREMENT_MS STABILITY MAX_TRIALS (see v2_load.sh)
#      SHARED (../shared next to the repo)  SKIP_BUILD (0)  TESSERA_BIN (target/release/tessera)
#      RESULTS (bench/results/batching-<time>)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SHARED="${SHARED:-$ROOT/../shared}"
PEER="$(cd "$SHARED/peers/triton" && pwd)"
CONCS="${CONCS:-1,4,16,64}"
PROTO="${PROTO:-http}"
T_HTTP=18000; T_GRPC=18001; T_METRICS=18002
case "$PROTO" in http) T_PORT=$T_HTTP ;; grpc) T_PORT=$T_GRPC ;;
  *) echo "PROTO must be http or grpc" >&2; exit 2 ;; esac
RESULTS="${RESULTS:-$ROOT/bench/results/batching-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$RESULTS"
export OUT_DIR="$RESULTS/raw"

TESSERA_PID=""
cleanup() {
  if [ -n "$TESSERA_PID" ] && kill -0 "$TESSERA_PID" 2>/dev/null; then
    kill -TERM "$TESSERA_PID" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$TESSERA_PID" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$TESSERA_PID" 2>/dev/null || true
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# perf_analyzer comes from the Triton peer's set-up (idempotent; no Triton server is started).
if [ ! -x "$PEER/.venv/pa/perf_analyzer/bin/perf_analyzer" ]; then
  echo "## setting up perf_analyzer (../shared/peers/triton/setup.sh)" >&2
  "$PEER/setup.sh" > "$RESULTS/triton-setup.log" 2>&1 || { tail -30 "$RESULTS/triton-setup.log" >&2; exit 1; }
fi

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  echo "## building tessera (release)" >&2
  cargo build --release --bin tessera >&2
fi
TESSERA_BIN="${TESSERA_BIN:-$ROOT/target/release/tessera}"
[ -x "$TESSERA_BIN" ] || { echo "no tessera binary at $TESSERA_BIN" >&2; exit 1; }

"$ROOT/scripts/setup-python.sh"
"$ROOT/.venv/bin/python" "$ROOT/scripts/gen_models.py"
export ORT_DYLIB_PATH="${ORT_DYLIB_PATH:-$("$ROOT/scripts/ort-dylib-path.sh")}"
for p in $T_HTTP $T_GRPC $T_METRICS; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "port $p is already in use" >&2; exit 1; fi
done
"$TESSERA_BIN" --model-repository "$ROOT/model_repository" \
  --http-port $T_HTTP --grpc-port $T_GRPC --metrics-port $T_METRICS --http-address 127.0.0.1 \
  > "$RESULTS/tessera.log" 2>&1 &
TESSERA_PID=$!
for i in $(seq 1 241); do
  if ! kill -0 "$TESSERA_PID" 2>/dev/null; then
    echo "tessera exited before becoming ready:" >&2; tail -30 "$RESULTS/tessera.log" >&2; exit 1
  fi
  [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$T_HTTP/v2/health/ready" || true)" = 200 ] && break
  [ "$i" = 241 ] && { echo "tessera not ready after 60 s; see $RESULTS/tessera.log" >&2; exit 1; }
  sleep 0.25
done
echo "## tessera ready (PID $TESSERA_PID)" >&2

for m in mlp_classifier mlp_classifier_batched; do
  echo "## tessera $m ($PROTO, concurrency $CONCS)" >&2
  LABEL=tessera SERVER_PID="$TESSERA_PID" "$PEER/v2_load.sh" "127.0.0.1:$T_PORT" "$PROTO" "$m" "$CONCS" >&2
done

python3 - "$OUT_DIR/summary.tsv" "$PROTO" <<'PY' | tee "$RESULTS/report.md"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
def num(v):
    try: return float(v)
    except ValueError: return None
print(f"Protocol: {sys.argv[2]}. Rows flagged ~ : perf_analyzer could not stabilise (3 windows averaged).\n")
print("| server | model | concurrency | infer/s | p50 us | p99 us | server CPU % | load1 |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r['label']} | {r['model']} | {r['conc']} | {r['infer_per_s']} | {r['p50_us']} | "
          f"{r['p99_us']} | {r['server_cpu_pct']} | {r['load1']} |")
by = {(r["model"], r["conc"].rstrip("~")): r for r in rows}
concs = sorted({k[1] for k in by}, key=int)
print("\nRatios batched / unbatched (mlp_classifier_batched / mlp_classifier).\n")
print("| concurrency | infer/s ratio | p50 ratio | p99 ratio | CPU per infer ratio |")
print("|---:|---:|---:|---:|---:|")
for c in concs:
    b, u = by.get(("mlp_classifier_batched", c)), by.get(("mlp_classifier", c))
    if b is None or u is None:
        continue
    def ratio(key):
        x, y = num(b[key]), num(u[key])
        return f"{x / y:.2f}" if x is not None and y else "-"
    cb, cu = num(b["server_cpu_pct"]), num(u["server_cpu_pct"])
    ib, iu = num(b["infer_per_s"]), num(u["infer_per_s"])
    cpi = f"{(cb / ib) / (cu / iu):.2f}" if None not in (cb, cu, ib, iu) and cu and ib and iu else "-"
    print(f"| {c} | {ratio('infer_per_s')} | {ratio('p50_us')} | {ratio('p99_us')} | {cpi} |")
PY
echo "(raw perf_analyzer output: $OUT_DIR)" >&2
