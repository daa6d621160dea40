#!/usr/bin/env bash
# Benchmark: data parallel across processes (MPI), in one run.
#  1. The gradient all-reduce of apps/wgan_gp's critic on 2 processes x 2 CPU devices
#     (apps/bench_processes): a bare MPI_Allreduce of the same bytes, our processes' all-reduce
#     (ProcessGroup), and the whole gradient sync of a training step; bus bandwidth and the ratio
#     to the bare MPI_Allreduce.
#  2. wgan_gp's step time on 1 process x 4 CPU devices against 2 processes x 2 CPU devices (the
#     same batch, seed and intra-op threads per device, by default cores / 4 so that both use
#     every core once), from the apps' metrics.csv: W warm-up generator steps, then N timed ones.
#   scripts/bench_processes.sh [--build DIR] [--width 32] [--norm layernorm] [--steps 20] [--warmup 3]
#                              [--batch-size 64] [--threads T] [--repeats 200] [--data DIR]
# Needs a build with MPI (build/apps/bench_processes) and Open MPI's mpirun (scripts/setup.sh installs it).
set -euo pipefail
cd "$(dirname "$0")/.."

build=build width=32 norm=layernorm steps=20 warmup=3 batch=64 repeats=200 threads=$(( $(nproc) / 4 > 0 ? $(nproc) / 4 : 1 ))
data=/usr/share/datasets/fashion-mnist
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --width) width=$2; shift 2 ;;
    --norm) norm=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    *) echo "bench_processes.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -x "$build/apps/bench_processes" ]] || {
  echo "bench_processes.sh: $build/apps/bench_processes not built (a build with MPI: --build DIR)" >&2
  exit 2
}
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "bench_processes.sh: --steps must be a positive integer, got $steps" >&2; exit 2; }
[[ "$warmup" =~ ^[0-9]+$ ]] || { echo "bench_processes.sh: --warmup must be a non-negative integer, got $warmup" >&2; exit 2; }
command -v mpirun >/dev/null || { echo "bench_processes.sh: no mpirun (apt-get install openmpi-bin)" >&2; exit 2; }
# Open MPI refuses root and more processes than cores unless told; other MPIs ignore these.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

echo "== gradient all-reduce: mpirun -np 2 $build/apps/bench_processes --devices cpu:2 --width $width --norm $norm"
mpirun -np 2 "$build/apps/bench_processes" --devices cpu:2 --width "$width" --norm "$norm" --repeats "$repeats"

critic_steps=5  # the WGAN-GP paper's, which the figures in docs/benchmarks.md use
total=$((warmup + steps))
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
common=(--steps "$total" --width "$width" --norm "$norm" --batch-size "$batch" --critic-steps "$critic_steps" --seed 0
        --threads "$threads" --data "$data" --sample-every 1000000000 --fid-every 1000000000 --final-fid-samples 0)
echo
echo "== wgan_gp step time: $warmup warm-up + $steps timed generator steps, batch $batch, norm $norm," \
  "$threads intra-op thread(s) per device, $(nproc) cores"
echo "   1 x 4: $build/apps/wgan_gp --devices cpu:4" >&2
"$build/apps/wgan_gp" "${common[@]}" --devices cpu:4 --out "$out/1x4" >"$out/1x4.log" 2>&1 ||
  { cat "$out/1x4.log" >&2; exit 1; }
echo "   2 x 2: mpirun -np 2 $build/apps/wgan_gp --devices cpu:2" >&2
mpirun -np 2 "$build/apps/wgan_gp" "${common[@]}" --devices cpu:2 --out "$out/2x2" >"$out/2x2.log" 2>&1 ||
  { cat "$out/2x2.log" >&2; exit 1; }

# metrics.csv: cumulative seconds per generator step (columns found by name). Prints seconds per
# timed step.
step_seconds() {
  awk -F, -v warmup="$warmup" -v steps="$steps" '
    NR == 1 { for (i = 1; i <= NF; ++i) col[$i] = i; next }
    $col["step"] == warmup { start = $col["seconds"] }
    { last = $col["seconds"]; last_step = $col["step"] }
    END {
      if (last_step != warmup + steps) { print "metrics.csv ends at step " last_step > "/dev/stderr"; exit 1 }
      printf "%.6f\n", (last - start) / steps
    }' "$1/metrics.csv"
}
one=$(step_seconds "$out/1x4")
two=$(step_seconds "$out/2x2")
printf '%-28s %12s %12s\n' "" "s/step" "images/s"
for row in "1 process x 4 devices:$one" "2 processes x 2 devices:$two"; do
  name=${row%%:*} s=${row##*:}
  awk -v n="$name" -v s="$s" -v images="$((batch * critic_steps))" 'BEGIN { printf "%-28s %12.4f %12.1f\n", n, s, images / s }'
done
awk -v a="$one" -v b="$two" 'BEGIN { printf "%-28s %12.3f   (2 x 2 time / 1 x 4 time)\n", "ratio", b / a }'
