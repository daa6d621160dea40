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
exec build/apps/wgan_gp "$@"
