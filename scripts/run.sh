#!/usr/bin/env bash
# Sets up, builds and runs the main program: WGAN-GP on FashionMNIST on the devices found (every
# GPU, else two CPU devices). Arguments go to it (see build/apps/wgan_gp --help).
# Its sample-quality number, a Fréchet distance, lives in the feature space of the classifier
# apps/classify trains: the first run trains that classifier (2 epochs) into runs/classify.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
if [[ ! -f runs/classify/model.safetensors ]]; then
  echo "== training the feature network for the Frechet distance (apps/classify, 2 epochs)"
  # No model means no finished run there: whatever a killed one left is replaced.
  build/apps/classify --epochs 2 --out runs/classify --overwrite
fi
# bfloat16 where the run is on CPU devices that compute it natively (AVX512-BF16 or AMX): on the
# 2-core Sapphire Rapids of 2026-11-26 the default run took 9:13 of training instead of 11:08, at the
# same final Frechet distance (38.06 against 38.2, at the earlier --lr 1e-4). float32 elsewhere:
# CPUs without those run bfloat16 slower, and on a GPU it gains nothing yet (docs/gpu.md).
# --precision or --dtype overrides it.
precision=()
if [[ " $* " != *" --precision"* && " $* " != *" --dtype"* ]] && ! nvidia-smi -L >/dev/null 2>&1 &&
  grep -qw -e avx512_bf16 -e amx_bf16 /proc/cpuinfo; then
  precision=(--precision bf16)
  echo "== bfloat16 (--precision bf16): this CPU has AVX512-BF16 or AMX"
fi
exec build/apps/wgan_gp "${precision[@]}" "$@"
