#!/usr/bin/env bash
# Benchmark: data loading (issue 26's baseline, before preprocessing leaves the process).
#  1. build/apps/bench_loader: batches/s and the consumer's wait per batch of the programs' pipelines
#     (classify's and segment's, plain and --augment), with 0, 1, 2 loader threads, each batch made on
#     one core.
#  2. Training images/s of classify --augment and segment --augment with each loader setting (the
#     apps' own figure, after --steps steps; 2 intra-op threads).
#   scripts/bench_loader.sh [--build DIR] [--data DIR] [--batches 300] [--steps 200] [--workers 0,1,2]
set -euo pipefail
cd "$(dirname "$0")/.."

build=build data=/usr/share/datasets/fashion-mnist batches=300 steps=200 workers=0,1,2
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --batches) batches=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    *) echo "bench_loader.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
for p in bench_loader classify segment; do
  [[ -x "$build/apps/$p" ]] || { echo "bench_loader.sh: $build/apps/$p not built (--build DIR)" >&2; exit 2; }
done
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "== the pipelines alone: $build/apps/bench_loader --batches $batches --workers $workers"
"$build/apps/bench_loader" --data "$data" --batches "$batches" --workers "$workers"

echo
echo "== training with --augment, $steps steps, 2 intra-op threads, by loader threads"
printf '%-10s %8s %10s\n' program threads images/s
# The apps print "... <rate> img/s" on their last progress line.
rate() { grep -o '[0-9.]* img/s' | tail -1 | cut -d' ' -f1; }
for w in ${workers//,/ }; do
  r=$("$build/apps/classify" --data "$data" --epochs 1 --steps "$steps" --threads 2 --workers "$w" --augment \
        --out "$out/classify_$w" --overwrite 2>&1 | rate)
  printf '%-10s %8s %10s\n' classify "$w" "$r"
done
for w in ${workers//,/ }; do
  r=$("$build/apps/segment" --data "$data" --epochs 1 --steps $((steps / 4)) --train-size 4000 --test-size 64 \
        --threads 2 --workers "$w" --augment --out "$out/segment_$w" --overwrite 2>&1 | rate)
  printf '%-10s %8s %10s\n' segment "$w" "$r"
done
