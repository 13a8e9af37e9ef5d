# Source this (bash): points the server at the GPU build of ONNX Runtime in .venv-gpu/
# (scripts/gpu/setup.sh) and puts the CUDA and cuDNN libraries of NVIDIA's wheels on the loader's
# path, where ONNX Runtime's CUDA provider looks for them.
_tessera_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
_tessera_site="$(ls -d "$_tessera_root"/.venv-gpu/lib/python3*/site-packages 2>/dev/null | head -1)"
if [ -z "$_tessera_site" ]; then
  echo "scripts/gpu/env.sh: no .venv-gpu; run scripts/gpu/setup.sh first" >&2
  return 1 2>/dev/null || exit 1
fi
ORT_DYLIB_PATH="$(ls "$_tessera_site"/onnxruntime/capi/libonnxruntime.so.1.* | sort | tail -1)"
export ORT_DYLIB_PATH
for _tessera_lib in "$_tessera_site"/nvidia/*/lib "$_tessera_site"/tensorrt_libs; do
  [ -d "$_tessera_lib" ] && LD_LIBRARY_PATH="$_tessera_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export LD_LIBRARY_PATH
unset _tessera_root _tessera_site _tessera_lib
