#!/usr/bin/env bash
# Configures and builds evenflow into build/ (or $BUILD_DIR). Extra arguments go to cmake's
# configure step; $TARGETS (space-separated) limits what is built. The programs and tests link
# evenflow's libraries statically here (EF_SHARED=OFF, what the benchmarks measure); an install
# builds them shared (README, "Use evenflow in your project").
# The CUDA backend is compiled and linked whenever the toolkit is found (EF_CUDA=AUTO). Configure
# prints evenflow's own lines (which backends and libraries were found), or everything if it fails.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${BUILD_DIR:-build}
configure_log=$(mktemp)
trap 'rm -f "$configure_log"' EXIT
if ! cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=${BUILD_TYPE:-Release} -DEF_SHARED=OFF "$@" >"$configure_log"; then
  cat "$configure_log"
  exit 1
fi
grep '^-- evenflow:' "$configure_log" || true
targets=()
for t in ${TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build_dir" --parallel "${JOBS:-$(nproc)}" "${targets[@]}"
