#!/usr/bin/env bash
# Benchmark: apps/classify against PyTorch (scripts/classify_torch.py) on FashionMNIST, same model,
# batch, optimizer, epochs and threads. Prints per epoch the training seconds of each and the ratio
# ours / theirs (< 1: we are faster), and the test accuracies.
#   scripts/bench_classify.sh [--epochs N] [--threads T] [--devices cpu] [--limit-steps K]
#                             [--seed S] [--build DIR] [--data DIR]
# --limit-steps K stops both after K steps (a quick smoke run); the lead runs the full benchmark.
# PYTHON=... picks PyTorch's interpreter (default: PyTorch 2.15 from PyPI, scripts/bench_python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

epochs=1 threads=$(nproc) devices=cpu limit=0 seed=0 build=build data=/usr/share/datasets/fashion-mnist
while [[ $# -gt 0 ]]; do
  case "$1" in
    --epochs) epochs=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --devices) devices=$2; shift 2 ;;
    --limit-steps) limit=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    *) echo "bench_classify.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -x "$build/apps/classify" ]] || { echo "bench_classify.sh: $build/apps/classify not built (--build DIR)" >&2; exit 2; }
torch_device=${devices%%:*}  # PyTorch runs on one device of that kind
python=${PYTHON:-$(bash scripts/bench_python.sh)}

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "== evenflow classify: $epochs epoch(s), $threads thread(s), $devices, seed $seed" >&2
"$build/apps/classify" --epochs "$epochs" --threads "$threads" --devices "$devices" --data "$data" \
  --steps "$limit" --seed "$seed" --out "$out/ef" >&2
echo "== PyTorch $("$python" -c 'import torch; print(torch.__version__)')" >&2
"$python" scripts/classify_torch.py --epochs "$epochs" --threads "$threads" --device "$torch_device" \
  --data "$data" --limit-steps "$limit" --seed "$seed" | tee "$out/torch.txt" >&2

# metrics.csv: epoch,step,train_loss,test_loss,test_accuracy,seconds,images_per_s
awk -F, 'NR > 1 { print $6, $5 }' "$out/ef/metrics.csv" > "$out/ef.txt"
awk '$1 == "epoch" { print $4, $8 }' "$out/torch.txt" > "$out/th.txt"
echo
printf '%-6s %12s %12s %8s %10s %10s\n' epoch "evenflow s" "pytorch s" ratio "ef acc" "torch acc"
paste -d' ' "$out/ef.txt" "$out/th.txt" | awk '{ printf "%-6d %12.2f %12.2f %8.2f %10.4f %10.4f\n", NR, $1, $3, $1 / $3, $2, $4 }'
