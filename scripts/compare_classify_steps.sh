#!/usr/bin/env bash
# Trains classify's network (no dropout) from the same initial weights on the same batches in
# evenflow and in PyTorch and prints both losses at a few steps with their relative difference:
# the frameworks train the same way if the losses agree to float32 rounding at first and then
# drift apart without a trend (float32 rounding grows chaotically; a wrong gradient would show a
# difference from step 1).
#   scripts/compare_classify_steps.sh [--build DIR] [--steps N] [--seed S]
# PYTHON=... picks PyTorch's interpreter (default: PyTorch 2.15 from PyPI, scripts/bench_python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build steps=200 seed=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    *) echo "compare_classify_steps.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -x "$build/apps/classify_steps" ]] || { echo "compare_classify_steps.sh: $build/apps/classify_steps not built" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$build/apps/classify_steps" --init "$tmp/init.safetensors" --steps "$steps" --seed "$seed" > "$tmp/ours.txt"
python=${PYTHON:-$(bash scripts/bench_python.sh)}
"$python" scripts/classify_steps_torch.py --init "$tmp/init.safetensors" --steps "$steps" > "$tmp/theirs.txt"
printf '%-6s %14s %14s %12s\n' step evenflow pytorch "rel. diff"
paste "$tmp/ours.txt" "$tmp/theirs.txt" |
  awk -v n="$steps" '$1 < 3 || $1 == 4 || $1 == 9 || $1 % 25 == 24 || $1 == n - 1 {
    printf "%-6d %14.9f %14.9f %12.2e\n", $1 + 1, $2, $4, ($2 - $4) / $4 }'
