#!/usr/bin/env bash
# Benchmark: data loading, in the training process and on a Ray cluster.
#  1. build/apps/bench_loader: batches/s and the consumer's wait per batch of the programs' pipelines
#     (classify's and segment's, plain and --augment), with 0, 1, 2 loader threads, each batch made on
#     one core, and (when the build has Ray) through a local Ray cluster of --ray-cpus CPUs that this
#     script starts on a free port and stops, with 1, 2, 4, 8 batches in flight.
#  2. Training images/s of classify --augment and segment --augment with each loader setting, and on
#     the cluster with --ray-in-flight batches in flight (the apps' own figure, after --steps steps;
#     2 intra-op threads).
#   scripts/bench_loader.sh [--build DIR] [--data DIR] [--batches 300] [--steps 200] [--workers 0,1,2]
#                           [--ray-cpus 2] [--ray-in-flight 4] [--no-ray]
set -euo pipefail
cd "$(dirname "$0")/.."

build=build data=/usr/share/datasets/fashion-mnist batches=300 steps=200 workers=0,1,2 ray_cpus=2 in_flight=4 use_ray=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --batches) batches=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --ray-cpus) ray_cpus=$2; shift 2 ;;
    --ray-in-flight) in_flight=$2; shift 2 ;;
    --no-ray) use_ray=0; shift ;;
    *) echo "bench_loader.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
for p in bench_loader classify segment; do
  [[ -x "$build/apps/$p" ]] || { echo "bench_loader.sh: $build/apps/$p not built (--build DIR)" >&2; exit 2; }
done
out=$(mktemp -d)
ray_bin=$HOME/.cache/evenflow/ray-2.60.0/bin
ray_args=()
if ((use_ray)) && [[ -x "$build/apps/ef_ray_driver" && -x "$ray_bin/ray" ]]; then
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  started=$("$ray_bin/ray" start --head --port="$port" --num-cpus="$ray_cpus" --disable-usage-stats \
              --include-dashboard=false 2>&1)
  address=$(grep -o "\-\-address='[^']*'" <<<"$started" | head -1 | cut -d"'" -f2)
  [[ -n "$address" ]] || { echo "bench_loader.sh: ray start failed: $started" >&2; exit 1; }
  ray_args=(--ray "$address")
  echo "== a local Ray cluster of $ray_cpus CPUs at $address"
else
  echo "== no Ray (--no-ray, or built without it: scripts/setup.sh --ray, -DEF_RAY=ON)"
fi
trap 'rm -rf "$out"; if ((${#ray_args[@]})); then "$ray_bin/ray" stop --force >/dev/null 2>&1; fi' EXIT

echo "== the pipelines alone: $build/apps/bench_loader --batches $batches --workers $workers ${ray_args[*]}"
"$build/apps/bench_loader" --data "$data" --batches "$batches" --workers "$workers" "${ray_args[@]}"

echo
echo "== training with --augment, $steps steps, 2 intra-op threads, by loader threads and on Ray"
printf '%-10s %-8s %8s %10s\n' program where workers images/s
# The apps print "... <rate> img/s" on their last progress line.
rate() { grep -o '[0-9.]* img/s' | tail -1 | cut -d' ' -f1; }
settings=()
for w in ${workers//,/ }; do settings+=("threads $w"); done
if ((${#ray_args[@]})); then settings+=("ray $in_flight"); fi
for s in "${settings[@]}"; do
  read -r where w <<<"$s"
  extra=(); if [[ $where == ray ]]; then extra=("${ray_args[@]}"); fi
  r=$("$build/apps/classify" --data "$data" --epochs 1 --steps "$steps" --threads 2 --workers "$w" --augment \
        "${extra[@]}" --out "$out/classify_$where$w" --overwrite 2>&1 | rate)
  printf '%-10s %-8s %8s %10s\n' classify "$where" "$w" "$r"
done
for s in "${settings[@]}"; do
  read -r where w <<<"$s"
  extra=(); if [[ $where == ray ]]; then extra=("${ray_args[@]}"); fi
  r=$("$build/apps/segment" --data "$data" --epochs 1 --steps $((steps / 4)) --train-size 4000 --test-size 64 \
        --threads 2 --workers "$w" --augment "${extra[@]}" --out "$out/segment_$where$w" --overwrite 2>&1 | rate)
  printf '%-10s %-8s %8s %10s\n' segment "$where" "$w" "$r"
done
