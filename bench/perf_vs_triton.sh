#!/usr/bin/env bash
# Tessera vs the real NVIDIA Triton, with Triton's own perf_analyzer (not run in CI).
#
#   bench/perf_vs_triton.sh
#
# 1. builds tessera in release (cargo build --release; SKIP_BUILD=1 to skip)
# 2. starts tessera on 127.0.0.1:18000 (HTTP) / 18001 (gRPC) / 18002 (metrics)
#    with ./model_repository
# 3. sets up and starts the real Triton from ../shared/peers/triton (setup.sh,
#    start_triton.sh: ports 8000/8001/8002, its own model_repository, Python backend)
# 4. runs ../shared/peers/triton/v2_load.sh HOST:PORT http MODEL CONCS against
#      tessera add_sub       (ONNX Runtime)
#      tessera add_sub_wasm  (Wasm handler; skipped when the model is not there)
#      triton  add_sub       (Python backend)
#    with SERVER_PID set, so the server's CPU (process tree) is sampled
# 5. prints one markdown table and tessera/triton ratios per concurrency
# Both servers are stopped on exit.
#
# Env: CONCS (1,4,16)  PROTO (http)  MEASUREMENT_MS STABILITY MAX_TRIALS (see v2_load.sh)
#      SHARED (../shared next to the repo)  SKIP_BUILD (0)  TESSERA_BIN (target/release/tessera)
#      RESULTS (bench/results/perf_vs_triton-<time>)
# Needs: cargo, curl, python3; scripts/setup-python.sh is run for the ONNX Runtime library.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
SHARED="${SHARED:-$ROOT/../shared}"
PEER="$(cd "$SHARED/peers/triton" && pwd)"
CONCS="${CONCS:-1,4,16}"
PROTO="${PROTO:-http}"
T_HTTP=18000; T_GRPC=18001; T_METRICS=18002
TRITON_HTTP=8000; TRITON_GRPC=8001
case "$PROTO" in http) T_PORT=$T_HTTP; TR_PORT=$TRITON_HTTP ;; grpc) T_PORT=$T_GRPC; TR_PORT=$TRITON_GRPC ;;
  *) echo "PROTO must be http or grpc" >&2; exit 2 ;; esac
RESULTS="${RESULTS:-$ROOT/bench/results/perf_vs_triton-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$RESULTS"
export OUT_DIR="$RESULTS/raw"

TESSERA_PID=""
TRITON_STARTED=0
cleanup() {
  if [ -n "$TESSERA_PID" ] && kill -0 "$TESSERA_PID" 2>/dev/null; then
    kill -TERM "$TESSERA_PID" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$TESSERA_PID" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$TESSERA_PID" 2>/dev/null || true
  fi
  if [ "$TRITON_STARTED" = 1 ]; then "$PEER/stop_triton.sh" > /dev/null 2>&1 || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_ready() {  # wait_ready PID PORT LOG NAME
  for _ in $(seq 1 240); do
    if ! kill -0 "$1" 2>/dev/null; then
      echo "$4 exited before becoming ready; last lines of $3:" >&2; tail -30 "$3" >&2; exit 1
    fi
    [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$2/v2/health/ready" || true)" = 200 ] && return 0
    sleep 0.25
  done
  echo "$4 not ready after 60 s; see $3" >&2; exit 1
}

model_status() {  # model_status PORT MODEL -> HTTP status of GET /v2/models/MODEL
  curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$1/v2/models/$2" || true
}

# --- 1. build -----------------------------------------------------------------
if [ "${SKIP_BUILD:-0}" != 1 ]; then
  echo "## building tessera (release)" >&2
  cargo build --release --bin tessera >&2
fi
TESSERA_BIN="${TESSERA_BIN:-$ROOT/target/release/tessera}"
[ -x "$TESSERA_BIN" ] || { echo "no tessera binary at $TESSERA_BIN" >&2; exit 1; }

# --- 2. tessera -----------------------------------------------------------------
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
wait_ready "$TESSERA_PID" $T_HTTP "$RESULTS/tessera.log" tessera
echo "## tessera ready (PID $TESSERA_PID)" >&2

# --- 3. triton ------------------------------------------------------------------
echo "## setting up Triton (../shared/peers/triton/setup.sh)" >&2
"$PEER/setup.sh" > "$RESULTS/triton-setup.log" 2>&1 || { tail -30 "$RESULTS/triton-setup.log" >&2; exit 1; }
if [ -f "$PEER/triton.pid" ] && kill -0 "$(cat "$PEER/triton.pid")" 2>/dev/null; then
  echo "a Triton started by start_triton.sh is already running (PID $(cat "$PEER/triton.pid")); stop it with $PEER/stop_triton.sh" >&2
  exit 1
fi
TRITON_STARTED=1
TRITON_PID="$("$PEER/start_triton.sh" | tail -1)"
echo "## triton ready (PID $TRITON_PID)" >&2

# --- 4. load --------------------------------------------------------------------
run_load() {  # run_load LABEL PID PORT MODEL
  echo "## $1 $4 ($PROTO, concurrency $CONCS)" >&2
  LABEL="$1" SERVER_PID="$2" "$PEER/v2_load.sh" "127.0.0.1:$3" "$PROTO" "$4" "$CONCS" >&2
}
run_load tessera "$TESSERA_PID" $T_PORT add_sub
if [ "$(model_status $T_HTTP add_sub_wasm)" = 200 ]; then
  run_load tessera "$TESSERA_PID" $T_PORT add_sub_wasm
else
  echo "## tessera add_sub_wasm: not in the repository (GET /v2/models/add_sub_wasm != 200), skipped" >&2
fi
run_load triton "$TRITON_PID" $TR_PORT add_sub

# --- 5. report ------------------------------------------------------------------
python3 - "$OUT_DIR/summary.tsv" "$PROTO" <<'PY' | tee "$RESULTS/report.md"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
proto = sys.argv[2]
def num(v):
    try: return float(v)
    except ValueError: return None
print(f"Protocol: {proto}. Rows flagged ~ : perf_analyzer could not stabilise (3 windows averaged).\n")
print("| server | model | concurrency | infer/s | p50 us | p99 us | server CPU % | load1 |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for r in rows:
    print(f"| {r['label']} | {r['model']} | {r['conc']} | {r['infer_per_s']} | {r['p50_us']} | "
          f"{r['p99_us']} | {r['server_cpu_pct']} | {r['load1']} |")
by = {(r["label"], r["model"], r["conc"].rstrip("~")): r for r in rows}
concs = sorted({k[2] for k in by}, key=int)
pairs = [("tessera", "add_sub"), ("tessera", "add_sub_wasm")]
print("\nRatios tessera / triton (Triton: Python-backend add_sub). infer/s > 1 and p50 < 1 favour tessera.\n")
print("| tessera model | concurrency | infer/s ratio | p50 ratio | p99 ratio | CPU ratio |")
print("|---|---:|---:|---:|---:|---:|")
def ratio(a, b, key):
    x, y = num(a[key]), num(b[key])
    return f"{x / y:.2f}" if x is not None and y else "-"
for label, model in pairs:
    for c in concs:
        t, tr = by.get((label, model, c)), by.get(("triton", "add_sub", c))
        if t is None or tr is None:
            continue
        print(f"| {model} | {c} | {ratio(t, tr, 'infer_per_s')} | {ratio(t, tr, 'p50_us')} | "
              f"{ratio(t, tr, 'p99_us')} | {ratio(t, tr, 'server_cpu_pct')} |")
PY
echo "(raw perf_analyzer output: $OUT_DIR)" >&2
