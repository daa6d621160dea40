#!/usr/bin/env bash
# Configures and builds evenflow into build/ (or $BUILD_DIR). Extra arguments go to cmake's
# configure step; $TARGETS (space-separated) limits what is built. The programs and tests link
# evenflow's libraries statically here (EF_SHARED=OFF, what the benchmarks measure); an install
# builds them shared (README, "Use evenflow in your project").
# The CUDA backend is compiled and linked whenever the toolkit is found (EF_CUDA=AUTO).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} -DEF_SHARED=OFF "$@" >/dev/null
targets=()
for t in ${TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build_dir" --parallel "${JOBS:-$(nproc)}" "${targets[@]}"
