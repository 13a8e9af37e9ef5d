#!/usr/bin/env bash
# The README's test command: prepares the machine, then runs every test suite.
#   1. Rust unit and end-to-end tests (the real binary over HTTP; the build compiles the Wasm
#      examples and the misbehaving-guest fixtures from source).
#   2. Host-target unit tests of the guest SDK and the example handlers (e.g. the tokenizer).
#   3. Compatibility tests with the real Python tritonclient against the real binary.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/prepare.sh
export ORT_DYLIB_PATH="$(scripts/ort-dylib-path.sh)"
START=$SECONDS
step() { echo "-- $1 ($(( SECONDS - START ))s)"; }
step "cargo test --workspace"
cargo test --workspace
# The guest workspaces' host-target tests share one target folder (set by .ci/run; their own
# folders otherwise).
GUEST_TARGET=()
[ -n "${GUEST_CHECK_TARGET_DIR:-}" ] && GUEST_TARGET=(--target-dir "$GUEST_CHECK_TARGET_DIR")
step "guest SDK tests"
cargo test --manifest-path guest-sdk/Cargo.toml "${GUEST_TARGET[@]}"
step "example handlers' tests"
cargo test --manifest-path examples/Cargo.toml "${GUEST_TARGET[@]}"
step "tritonclient and openai tests"
TESSERA_BIN="$ROOT/target/debug/tessera" .venv/bin/python -m pytest -q --durations=15 tests/python
step done
