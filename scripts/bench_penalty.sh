#!/usr/bin/env bash
# Benchmark of accuracy, not speed: the WGAN-GP penalty's gradients with respect to the critic's
# parameters in bfloat16, evenflow's (--precision bf16: apps/tools/penalty_grads) and PyTorch's
# (torch.autocast bf16), each as a relative error against float64 per parameter, with max and median
# (scripts/penalty_error_torch.py). Same critic (apps/wgan_gp's, PyTorch's initialisation, optionally
# trained a few critic steps), same weights, real and generated batch and interpolation weights.
#   scripts/bench_penalty.sh [--critic-steps K] [--width W] [--norm layernorm|none] [--batch-size B]
#                            [--seed S] [--threads T] [--build DIR] [--data DIR]
# PYTHON=... picks PyTorch's interpreter (default: PyTorch 2.15 from PyPI, scripts/bench_python.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
build=build common=() ef_args=() threads=1
while [[ $# -gt 0 ]]; do
  case "$1" in
    --critic-steps|--batch-size|--seed|--data) common+=("$1" "$2"); shift 2 ;;
    --width|--norm) common+=("$1" "$2"); ef_args+=("$1" "$2"); shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "bench_penalty.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -x "$build/apps/penalty_grads" ]] || { echo "bench_penalty.sh: $build/apps/penalty_grads not built (--build DIR)" >&2; exit 2; }
python=${PYTHON:-$(bash scripts/bench_python.sh)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$python" scripts/penalty_error_torch.py inputs --out "$tmp/inputs.safetensors" --threads "$threads" "${common[@]}"
"$build/apps/penalty_grads" --inputs "$tmp/inputs.safetensors" --out "$tmp/evenflow.safetensors" \
  --threads "$threads" "${ef_args[@]}" >&2
"$python" scripts/penalty_error_torch.py report --inputs "$tmp/inputs.safetensors" --evenflow "$tmp/evenflow.safetensors" \
  --threads "$threads" "${common[@]}"
