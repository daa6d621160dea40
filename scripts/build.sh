#!/usr/bin/env bash
# Configures and builds evenflow into build/ (or $BUILD_DIR). Extra arguments go to cmake.
# The CUDA backend is compiled and linked whenever the toolkit is found (EF_CUDA=AUTO).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} "$@" >/dev/null
cmake --build "$build_dir" --parallel "${JOBS:-$(nproc)}"
