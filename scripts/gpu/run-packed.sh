#!/usr/bin/env bash
# Runs on a GPU machine with no network, from the parts scripts/gpu/pack.sh made in .gpu-pack/:
# unpacks them once into /tmp/tessera-gpu, points the server and the benches at the packed ONNX
# Runtime and at NVIDIA's CUDA libraries in python3's site-packages, then runs the GPU checks.
#   bash scripts/gpu/run-packed.sh [e2e|bench|variants|llm|all]      (default: all)
# e2e: scripts/gpu/e2e.sh. bench: bench/gpu_vs_ort.py on MiniLM and a wide MLP (MODELS="minilm mlp",
# INSTANCES, CONCURRENCY, SECONDS_PER_LEVEL, ROWS per request, INTRA: the model's
# intra_op_thread_count). variants: bench/gpu_session_variants.py (a bare session in the server's
# settings; needs cupy or torch, as the GPU machines here have). llm: the LLM
# engine on the GPU against the CPU (bench/llm_gpu.sh), if the pack holds the CUDA build.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
G=/tmp/tessera-gpu
if [ ! -f "$G/.unpacked" ]; then
  mkdir -p "$G"
  if command -v xz > /dev/null; then unxz=(xz -dc -T0); else
    unxz=(python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)')
  fi
  cat .gpu-pack/p*/part.* | "${unxz[@]}" | tar -x -C "$G"
  python3 -m pip install -q --no-index --no-deps --target "$G/site" "$G"/wheels/*.whl
  touch "$G/.unpacked"
fi
[ -f model_repository/minilm/1/model.onnx ] || mkdir -p model_repository/minilm/1 && cp "$G/models/minilm.onnx" model_repository/minilm/1/model.onnx
if [ -f "$G/models/model.gguf" ] && [ ! -f model_repository/tensorrt_llm/1/model.gguf ]; then
  mkdir -p model_repository/tensorrt_llm/1 && cp "$G/models/model.gguf" model_repository/tensorrt_llm/1/model.gguf
fi
SITE="$(python3 -c 'import site; print(site.getsitepackages()[0])')"
ORT_DYLIB_PATH="$(ls "$G"/ort/onnxruntime/capi/libonnxruntime.so.1.* | head -1)"
for lib in "$SITE"/nvidia/*/lib /usr/local/cuda/lib64; do
  [ -d "$lib" ] && LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
# The pack's plain server, or else its CUDA build (a full server too, with llama.cpp's libraries).
if [ -x "$G/bin/tessera" ]; then TESSERA_BIN="$G/bin/tessera"; else
  TESSERA_BIN="$G/cuda/tessera"; LD_LIBRARY_PATH="$G/cuda:$LD_LIBRARY_PATH"
fi
export ORT_DYLIB_PATH LD_LIBRARY_PATH TESSERA_BIN PYTHONPATH="$G/ort:$G/site" PYTHONUNBUFFERED=1
nvidia-smi -L || true
case "${1:-all}" in
  e2e) scripts/gpu/e2e.sh ;;
  bench)  # with perf_analyzer as the load when the pack has it, else Python clients
    load=python
    if [ -x "$G/site/perf_analyzer/bin/perf_analyzer" ]; then
      export PERF_ANALYZER="$G/site/perf_analyzer/bin/perf_analyzer"; load=perf_analyzer
    fi
    for instances in ${INSTANCES:-1}; do
      for model in ${MODELS:-minilm mlp}; do
        case "$model" in
          minilm) model="--model model_repository/minilm" ;;
          mlp) model="--wide-mlp 4096" ;;
          *) echo "MODELS: minilm and/or mlp, not '$model'" >&2; exit 2 ;;
        esac
        # shellcheck disable=SC2086
        python3 bench/gpu_vs_ort.py $model --concurrency "${CONCURRENCY:-1,4,16,64}" --seconds "${SECONDS_PER_LEVEL:-5}" \
          --load "$load" --instances "$instances" --rows "${ROWS:-1}" ${INTRA:+--intra "$INTRA"}
      done
    done ;;
  variants)  # a bare session in the server's settings and in ONNX Runtime's defaults
    python3 bench/gpu_session_variants.py --wide-mlp 4096
    python3 bench/gpu_session_variants.py --model model_repository/minilm ;;
  llm)
    [ -x "$G/cuda/tessera" ] || { echo "the pack has no CUDA build of the LLM engine (LLM_CUDA=1 scripts/gpu/pack.sh)"; exit 1; }
    LD_LIBRARY_PATH="$G/cuda:$LD_LIBRARY_PATH" TESSERA_BIN="$G/cuda/tessera" LLM_BARE="$G/cuda/llm_bare" bench/llm_gpu.sh ;;
  all)  # each part runs even when one before it fails; the exit status says whether all passed
    rc=0
    for part in e2e bench llm; do echo "=== $part"; "$0" "$part" || { rc=1; echo "=== $part FAILED"; }; done
    exit $rc ;;
  *) echo "usage: run-packed.sh [e2e|bench|variants|llm|all]" >&2; exit 2 ;;
esac
