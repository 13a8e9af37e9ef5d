#!/usr/bin/env bash
# The sentence-embedding pipeline, tessera vs the real Triton 2.51, with Triton's perf_analyzer
# (not run in CI). Both serve an ensemble "embed_text": TEXT -> WordPiece tokenizer ->
# all-MiniLM-L6-v2 int8 (the same model.onnx, 1 intra-op thread) -> mean pooling + L2 -> EMBEDDING.
#   tessera: model_repository/embed_text   (preprocess_text and pool_embeddings are Wasm
#            handlers, minilm runs in ONNX Runtime)
#   Triton:  bench/triton_models/embed_text (tokenize, minilm, pool are Python-backend models;
#            minilm calls onnxruntime from Python), as Triton users build it on a CPU-only Triton
#
#   SKIP_BUILD=1 bench/pipeline_vs_triton.sh              # minilm without dynamic batching
#   SKIP_BUILD=1 bench/pipeline_vs_triton.sh --batching   # ... and again with it, both servers
#   SKIP_BUILD=1 bench/pipeline_vs_triton.sh --batching-only
#
# minilm's dynamic batcher (tessera's like Triton's) merges only requests of the same shape, and
# the tokenizers pad each request to its own longest text: sentences of different token counts
# are not merged.
#
# 1. builds tessera in release (SKIP_BUILD=1 skips it); prepares models, perf_analyzer and the
#    Triton peer (bench/setup_triton_peers.sh: onnxruntime in its venv)
# 2. for each variant (unbatched; with --batching also batched: a temporary copy of the
#    repository whose minilm/config.pbtxt gains
#    dynamic_batching { max_queue_delay_microseconds: MAX_QUEUE_DELAY_US }), for each server,
#    one at a time: start it (tessera 127.0.0.1:18000, Triton 127.0.0.1:18100), check the
#    embeddings (bench/embed_check.py: cosine of "A man is eating food." / "A man is eating a
#    piece of bread." about 0.755), run v2_load.sh embed_text at CONCS with
#    --input-data bench/perf_data/embed_text.json (16 English sentences, 8-19 tokens; perf_analyzer
#    sends them in turn, one text per request), stop it
# 3. prints a markdown table and tessera/Triton (and batched/unbatched) ratios.
#    Raw output, logs and report.md: bench/results/<time>-pipeline_vs_triton/
#
# Env: CONCS (1,4,16)  REPS (1)  MAX_QUEUE_DELAY_US (2000)  SERVERS ("tessera triton")
#      MINILM_INSTANCES (1; e.g. 2 gives minilm two instances on both servers, each with one
#      intra-op thread: one per core on this machine)
#      BATCHING (0; 1 = same as --batching, "only" = the batched variant alone)
#      MEASUREMENT_MS (3000) STABILITY (50) MAX_TRIALS (10)  PROTO (http)  SKIP_BUILD (0)
#      TESSERA_BIN  SHARED  RESULTS  ports: see bench/lib.sh
set -euo pipefail
# shellcheck source=bench/lib.sh
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib.sh"
cd "$ROOT"
BATCHING="${BATCHING:-0}"
for arg in "$@"; do
  case "$arg" in
    --batching) BATCHING=1 ;;
    --batching-only) BATCHING=only ;;
    -h|--help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg (see --help)" >&2; exit 2 ;;
  esac
done
case "$BATCHING" in
  0) VARIANTS="unbatched" ;;
  1) VARIANTS="unbatched batched" ;;
  only) VARIANTS="batched" ;;
  *) echo "BATCHING must be 0, 1 or only" >&2; exit 2 ;;
esac
CONCS="${CONCS:-1,4,16}"
REPS="${REPS:-1}"
SERVERS="${SERVERS:-tessera triton}"
DELAY="${MAX_QUEUE_DELAY_US:-2000}"
INSTANCES="${MINILM_INSTANCES:-1}"
DATA="$ROOT/bench/perf_data/embed_text.json"
[ -f "$DATA" ] || die "missing $DATA"
bench_init pipeline_vs_triton
echo "concurrency: $CONCS  reps: $REPS  servers: $SERVERS  variants: $VARIANTS (max_queue_delay_microseconds $DELAY)  minilm instances: $INSTANCES" >> "$RESULTS/env.txt"

has() { [[ " $SERVERS " == *" $1 "* ]]; }
has tessera && tessera_prepare
ensure_perf_analyzer
triton_prepare   # also fetches minilm/1/model.onnx and gives embed_check.py its tritonclient

# The models of each ensemble (its steps) must be ready before the load starts.
steps() { sed -n 's/^[[:space:]]*model_name:[[:space:]]*"\([^"]*\)".*/\1/p' "$1/embed_text/config.pbtxt" | tr '\n' ' '; }
T_REPO="$ROOT/model_repository"
TR_REPO="$ROOT/bench/triton_models"
wasm_steps() { local m; for m in $(steps "$1"); do if grep -q 'backend:[[:space:]]*"wasm"' "$1/$m/config.pbtxt"; then echo "$m"; fi; done; }
# shellcheck disable=SC2046
if has tessera; then need_wasm "$T_REPO" $(wasm_steps "$T_REPO"); fi
if [ "$INSTANCES" != 1 ]; then
  has tessera && repo_variant "$T_REPO" "$BENCH_TMP/tessera_repo" minilm keep "$INSTANCES"
  has triton && repo_variant "$TR_REPO" "$BENCH_TMP/triton_repo" minilm keep "$INSTANCES"
  T_REPO="$BENCH_TMP/tessera_repo"; TR_REPO="$BENCH_TMP/triton_repo"
fi
if [[ " $VARIANTS " == *" batched "* ]]; then
  has tessera && repo_variant "$T_REPO" "$BENCH_TMP/tessera_repo_batched" minilm "$DELAY"
  has triton && repo_variant "$TR_REPO" "$BENCH_TMP/triton_repo_batched" minilm "$DELAY"
fi

CHECK_PY="$PEER/.venv/bin/python"
check() {  # check LABEL PORT
  if ! "$CHECK_PY" "$ROOT/bench/embed_check.py" "127.0.0.1:$2" embed_text > "$RESULTS/check-$1.txt" 2>&1; then
    cat "$RESULTS/check-$1.txt" >&2; die "$1: the embed_text check failed (see $RESULTS/check-$1.txt)"
  fi
  log "$(cat "$RESULTS/check-$1.txt")"
  echo "check $1: $(cat "$RESULTS/check-$1.txt")" >> "$RESULTS/env.txt"
}

for rep in $(seq 1 "$REPS"); do
  for v in $VARIANTS; do
    suffix=""; [ "$v" = batched ] && suffix="-batched"
    if has tessera; then
      repo="$T_REPO"; [ "$v" = batched ] && repo="$BENCH_TMP/tessera_repo_batched"
      # shellcheck disable=SC2046
      start_tessera "$repo" "tessera$suffix-rep$rep" embed_text $(steps "$repo")
      [ "$rep" = 1 ] && check "tessera$suffix" "$T_HTTP"
      run_load "tessera$suffix" "$TESSERA_PID" "$T_PORT" embed_text --input-data "$DATA"
      stop_tessera
    fi
    if has triton; then
      repo="$TR_REPO"; [ "$v" = batched ] && repo="$BENCH_TMP/triton_repo_batched"
      # shellcheck disable=SC2046
      start_triton "$repo" "triton$suffix-rep$rep" $(steps "$repo") embed_text
      [ "$rep" = 1 ] && check "triton$suffix" "$TR_HTTP"
      run_load "triton$suffix" "$TRITON_PID" "$TR_PORT" embed_text --input-data "$DATA"
      stop_triton
    fi
  done
done

python3 "$ROOT/bench/report.py" pipeline "$OUT_DIR/summary.tsv" proto="$PROTO" delay_us="$DELAY" | tee "$RESULTS/report.md"
log "raw perf_analyzer output and logs: $RESULTS"
