#!/usr/bin/env bash
# Benchmark: oneDNN's bfloat16 convolutions against its float32 ones on wgan_gp's two convolution
# shapes, each pass alone and with the reorders engine/cpu/onednn_conv.cpp runs around it, and
# again with the activations channels-last on both sides (what keeping them in that layout would
# save), in the oneDNN 3.2 evenflow links (scripts/setup.sh) and, when Debian's libdnnl-dev is
# installed, in its 2.6 too, in the same run: why evenflow moved to 3.x (docs/benchmarks.md,
# "Mixed precision"), and the lever left on an AMD Zen 4 ("On an AMD Zen 4").
#   bash scripts/bench_onednn_bf16.sh [--threads N] [--batch B]
set -euo pipefail
cd "$(dirname "$0")/.."
threads=2 batch=64
while [[ $# -gt 0 ]]; do
  case $1 in
    --threads) threads=$2; shift 2 ;;
    --batch) batch=$2; shift 2 ;;
    *) echo "bench_onednn_bf16.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
bash scripts/setup.sh >&2
root=${EF_ONEDNN_ROOT:-$HOME/.cache/evenflow/onednn-3.2}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
g++ -O2 -std=c++17 -fopenmp scripts/onednn_conv_bf16.cpp -I"$root/include" -L"$root/lib" -Wl,-rpath,"$root/lib" \
  -ldnnl -o "$out/linked"
builds=()
if [[ -f /usr/include/oneapi/dnnl/dnnl.hpp ]]; then
  g++ -O2 -std=c++17 -fopenmp scripts/onednn_conv_bf16.cpp -ldnnl -o "$out/debian"
  builds+=(debian)
else
  echo "(Debian's libdnnl-dev is not installed: oneDNN 3.2 alone)"
fi
builds+=(linked)
grep -m1 "model name" /proc/cpuinfo
for b in "${builds[@]}"; do
  OMP_NUM_THREADS=$threads "$out/$b" "$batch"
  echo
done
