# Shared plumbing of the bench/*.sh scripts (sourced, not run). Not run in CI.
#
# Servers: tessera (target/release/tessera) on 127.0.0.1:18000/18001/18002 and the real Triton
# (../shared/peers/triton, Python backend) on 127.0.0.1:18100/18101/18102, one at a time; both
# are stopped when the script exits. Load: ../shared/peers/triton/v2_load.sh (Triton's
# perf_analyzer), rows appended to $OUT_DIR/summary.tsv, labelled by server/variant.
#
# Env understood by every script (see each script for its own):
#   SKIP_BUILD (0; 1 = do not run cargo build)   TESSERA_BIN (target/release/tessera)
#   PROTO (http or grpc)   SHARED (../shared next to the repo)
#   T_HTTP/T_GRPC/T_METRICS (18000/18001/18002)   TR_HTTP/TR_GRPC/TR_METRICS (18100/18101/18102)
#   MEASUREMENT_MS STABILITY MAX_TRIALS (v2_load.sh)   RESULTS (bench/results/<time>-<bench>)
# shellcheck shell=bash

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SHARED="${SHARED:-$ROOT/../shared}"
PEER="$(cd "$SHARED/peers/triton" 2>/dev/null && pwd || true)"
[ -n "$PEER" ] || { echo "no Triton peer at $SHARED/peers/triton (set SHARED)" >&2; exit 1; }
PROTO="${PROTO:-http}"
T_HTTP="${T_HTTP:-18000}"; T_GRPC="${T_GRPC:-18001}"; T_METRICS="${T_METRICS:-18002}"
TR_HTTP="${TR_HTTP:-18100}"; TR_GRPC="${TR_GRPC:-18101}"; TR_METRICS="${TR_METRICS:-18102}"
case "$PROTO" in
  http) T_PORT=$T_HTTP; TR_PORT=$TR_HTTP ;;
  grpc) T_PORT=$T_GRPC; TR_PORT=$TR_GRPC ;;
  *) echo "PROTO must be http or grpc" >&2; exit 2 ;;
esac
TESSERA_BIN="${TESSERA_BIN:-$ROOT/target/release/tessera}"

TESSERA_PID=""
TRITON_PID=""
TRITON_STARTED=0
TRITON_LOG_NAME=""
BENCH_TMP=""

log() { echo "## $*" >&2; }
die() { echo "error: $*" >&2; exit 1; }

# bench_init NAME: results folder ($RESULTS, $OUT_DIR exported for v2_load.sh), traps, env.txt.
bench_init() {
  RESULTS="${RESULTS:-$ROOT/bench/results/$(date +%Y%m%d-%H%M%S)-$1}"
  mkdir -p "$RESULTS"
  RESULTS="$(cd "$RESULTS" && pwd)"
  export OUT_DIR="$RESULTS/raw"
  mkdir -p "$OUT_DIR"
  # perf_analyzer's own CPU time goes to $OUT_DIR/client_cpu.tsv (bench/timed_perf_analyzer.sh).
  export REAL_PERF_ANALYZER="${PERF_ANALYZER:-$PEER/perf_analyzer.sh}"
  export PERF_ANALYZER="$ROOT/bench/timed_perf_analyzer.sh"
  BENCH_TMP="$(mktemp -d "${TMPDIR:-/tmp}/tessera-bench.XXXXXX")"
  trap bench_cleanup EXIT
  trap 'exit 130' INT TERM
  {
    echo "bench: $1"
    echo "date: $(date -Is)"
    echo "git: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (dirty)')"
    echo "host: $(uname -srm), $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "proto: $PROTO  MEASUREMENT_MS=${MEASUREMENT_MS:-3000} STABILITY=${STABILITY:-50} MAX_TRIALS=${MAX_TRIALS:-10}"
  } > "$RESULTS/env.txt"
  log "results: $RESULTS"
}

bench_cleanup() {
  local rc=$?
  stop_tessera
  stop_triton
  if [ -n "$BENCH_TMP" ]; then rm -rf "$BENCH_TMP"; fi
  return $rc
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_models PID PORT LOG NAME MODEL...: until every MODEL answers /v2/models/M/ready (120 s).
# Per-model readiness, not /v2/health/ready: a model this bench does not use may fail to load.
wait_models() {
  local pid="$1" port="$2" logf="$3" name="$4"; shift 4
  local i m ok
  for i in $(seq 1 480); do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "$name exited before its models were ready; last lines of $logf:" >&2; tail -30 "$logf" >&2; exit 1
    fi
    ok=1
    for m in "$@"; do
      [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v2/models/$m/ready" || true)" = 200 ] || { ok=0; break; }
    done
    [ $ok = 1 ] && return 0
    [ "$i" = 480 ] || sleep 0.25
  done
  die "$name: models '$*' not ready after 120 s (last waited for '$m'); see $logf"
}

# --- tessera ----------------------------------------------------------------------------------

# tessera_prepare: build (unless SKIP_BUILD=1), Python venv (ORT library), generated and fetched
# models, perf_analyzer. Exports ORT_DYLIB_PATH.
tessera_prepare() {
  if [ "${SKIP_BUILD:-0}" != 1 ]; then
    log "building tessera (release; SKIP_BUILD=1 skips this)"
    (cd "$ROOT" && cargo build --release --bin tessera) >&2
  fi
  [ -x "$TESSERA_BIN" ] || die "no tessera binary at $TESSERA_BIN (build it: cargo build --release --bin tessera)"
  if ! "$ROOT/scripts/ort-dylib-path.sh" > /dev/null 2>&1; then "$ROOT/scripts/setup-python.sh" >&2; fi
  "$ROOT/.venv/bin/python" "$ROOT/scripts/gen_models.py" >&2
  "$ROOT/scripts/fetch_models.sh" >&2
  ORT_DYLIB_PATH="${ORT_DYLIB_PATH:-$("$ROOT/scripts/ort-dylib-path.sh")}"
  export ORT_DYLIB_PATH
  {
    echo "tessera: $TESSERA_BIN ($("$TESSERA_BIN" --version 2>/dev/null || echo '?'), built $(date -r "$TESSERA_BIN" -Is))"
    echo "ORT_DYLIB_PATH: $ORT_DYLIB_PATH"
  } >> "$RESULTS/env.txt"
  ensure_perf_analyzer
}

# need_wasm REPO MODEL...: the Wasm handlers are installed by cargo build (host/build.rs).
need_wasm() {
  local repo="$1" m; shift
  for m in "$@"; do
    [ -f "$repo/$m/1/model.wasm" ] || die "$repo/$m/1/model.wasm missing: it is installed by 'cargo build' (host/build.rs)"
  done
}

# start_tessera REPO LOGNAME MODEL...: serves REPO, waits for MODELs; sets TESSERA_PID.
start_tessera() {
  local repo="$1" logname="$2"; shift 2
  local p
  for p in "$T_HTTP" "$T_GRPC" "$T_METRICS"; do
    port_in_use "$p" && die "port $p is already in use (tessera's; set T_HTTP/T_GRPC/T_METRICS)"
  done
  "$TESSERA_BIN" --model-repository "$repo" --store "$RESULTS/store" \
    --http-address 127.0.0.1 --http-port "$T_HTTP" --grpc-address 127.0.0.1 --grpc-port "$T_GRPC" \
    --metrics-port "$T_METRICS" \
    > "$RESULTS/$logname.log" 2>&1 &
  TESSERA_PID=$!
  wait_models "$TESSERA_PID" "$T_HTTP" "$RESULTS/$logname.log" tessera "$@"
  log "tessera ready (PID $TESSERA_PID, $repo)"
}

stop_tessera() {
  if [ -n "$TESSERA_PID" ] && kill -0 "$TESSERA_PID" 2>/dev/null; then
    kill -TERM "$TESSERA_PID" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$TESSERA_PID" 2>/dev/null || break; sleep 0.25; done
    kill -KILL "$TESSERA_PID" 2>/dev/null || true
    wait "$TESSERA_PID" 2>/dev/null || true
  fi
  TESSERA_PID=""
}

# --- triton -----------------------------------------------------------------------------------

ensure_perf_analyzer() {
  if [ ! -x "$PEER/.venv/pa/perf_analyzer/bin/perf_analyzer" ]; then
    log "setting up perf_analyzer ($PEER/setup.sh)"
    "$PEER/setup.sh" > "$RESULTS/triton-setup.log" 2>&1 || { tail -30 "$RESULTS/triton-setup.log" >&2; exit 1; }
  fi
}

# triton_prepare: the peer's venv (tritonserver, perf_analyzer, onnxruntime for minilm).
triton_prepare() {
  "$ROOT/bench/setup_triton_peers.sh" 2>> "$RESULTS/triton-setup.log" \
    || { tail -30 "$RESULTS/triton-setup.log" >&2; exit 1; }
  echo "triton: $("$PEER/.venv/bin/python" -c 'import importlib.metadata as m; print("nvidia-pytriton", m.version("nvidia-pytriton"), "(tritonserver 2.51), onnxruntime", m.version("onnxruntime"))' 2>/dev/null || echo '?'), Python backend" >> "$RESULTS/env.txt"
}

# start_triton REPO LOGNAME MODEL...: explicit model control, loads only the MODELs; sets TRITON_PID.
start_triton() {
  local repo="$1" logname="$2"; shift 2
  local p m args="--model-control-mode=explicit"
  if [ -f "$PEER/triton.pid" ] && kill -0 "$(cat "$PEER/triton.pid")" 2>/dev/null; then
    die "a Triton started by start_triton.sh is already running (PID $(cat "$PEER/triton.pid")); stop it with $PEER/stop_triton.sh"
  fi
  for p in "$TR_HTTP" "$TR_GRPC" "$TR_METRICS"; do
    port_in_use "$p" && die "port $p is already in use (Triton's; set TR_HTTP/TR_GRPC/TR_METRICS)"
  done
  for m in "$@"; do args="$args --load-model=$m"; done
  TRITON_STARTED=1
  TRITON_LOG_NAME="$logname"
  TRITON_PID="$(MODEL_REPO="$repo" HTTP_PORT="$TR_HTTP" GRPC_PORT="$TR_GRPC" METRICS_PORT="$TR_METRICS" \
    EXTRA_ARGS="$args ${TRITON_EXTRA_ARGS:-}" "$PEER/start_triton.sh" | tail -1)"
  wait_models "$TRITON_PID" "$TR_HTTP" "$PEER/triton.log" triton "$@"
  log "triton ready (PID $TRITON_PID, $repo)"
}

stop_triton() {
  if [ "$TRITON_STARTED" = 1 ]; then
    "$PEER/stop_triton.sh" > /dev/null 2>&1 || true
    if [ -n "$TRITON_LOG_NAME" ] && [ -n "${RESULTS:-}" ]; then
      cp -f "$PEER/triton.log" "$RESULTS/$TRITON_LOG_NAME.log" 2>/dev/null || true
    fi
  fi
  TRITON_STARTED=0
  TRITON_PID=""
}

# --- load -------------------------------------------------------------------------------------

# run_load LABEL PID PORT MODEL [perf_analyzer args...]: v2_load.sh at $CONCS, rows -> summary.tsv.
run_load() {
  local label="$1" pid="$2" port="$3" model="$4"; shift 4
  log "$label $model ($PROTO, concurrency $CONCS)"
  LABEL="$label" SERVER_PID="$pid" "$PEER/v2_load.sh" "127.0.0.1:$port" "$PROTO" "$model" "$CONCS" "$@" >&2
}

# repo_variant SRC DEST MODEL DELAY_US [COUNT]: copies model repository SRC to DEST; MODEL's
# config.pbtxt gains dynamic_batching { max_queue_delay_microseconds: DELAY_US } (replacing any it
# had; DELAY_US "keep" leaves batching as it is) and, with COUNT, its instance_group count becomes
# COUNT. Relative "*_path" parameters are made absolute (they are resolved from the model's folder).
repo_variant() {
  local src="$1" dest="$2" model="$3" delay="$4" count="${5:-}"
  rm -rf "$dest"
  cp -a "$src" "$dest"
  python3 - "$src" "$dest" "$model" "$delay" "$count" <<'PY'
import os, re, sys
src, dest, model, delay, count = sys.argv[1:]
for name in sorted(os.listdir(dest)):
    path = os.path.join(dest, name, "config.pbtxt")
    if not os.path.isfile(path):
        continue
    text = open(path).read()
    def absolute(m):
        value = m.group(2)
        if os.path.isabs(value):
            return m.group(0)
        return m.group(1) + os.path.normpath(os.path.join(src, name, value)) + m.group(3)
    text = re.sub(r'(key:\s*"[A-Za-z0-9_]*_path"\s*value\s*\{\s*string_value:\s*")([^"]*)(")', absolute, text)
    if name == model and delay != "keep":
        # drop an existing dynamic_batching block (no nested braces in it), then add ours
        text = re.sub(r"\ndynamic_batching\s*\{[^{}]*\}\s*", "\n", text)
        text = text.rstrip("\n") + f"\ndynamic_batching {{\n  max_queue_delay_microseconds: {int(delay)}\n}}\n"
    if name == model and count:
        text, n = re.subn(r"(instance_group[^\]]*?\bcount:\s*)\d+", r"\g<1>" + str(int(count)), text, count=1)
        if n != 1:
            sys.exit(f"{path}: no instance_group count to set")
    open(path, "w").write(text)
PY
}
