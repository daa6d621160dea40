#!/usr/bin/env bash
# Benchmark: data-parallel memory balance and step time (apps/bench_parallel). Prints each device's
# peak memory for the balanced criterion and for the gather-on-first-device baseline, the ratio
# first-device peak / mean of the others, and the step time on N devices against one. Builds nothing.
#   scripts/bench_parallel.sh [--build DIR] [--devices cpu:4|cuda|cuda:0,1] [--batch 32] [--classes 10]
#                             [--size 128] [--steps 3] [--dtype float32|float64] [--threads T]
# Several CUDA logical devices on one GPU: EF_CUDA_DEVICES=0,0,0,0 scripts/bench_parallel.sh --devices cuda
set -euo pipefail
cd "$(dirname "$0")/.."

build=build
args=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
[[ -x "$build/apps/bench_parallel" ]] || { echo "bench_parallel.sh: $build/apps/bench_parallel not built (--build DIR)" >&2; exit 2; }
exec "$build/apps/bench_parallel" "${args[@]}"
