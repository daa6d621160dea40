#!/usr/bin/env bash
# Sets up, builds and runs the main program, the FashionMNIST classifier. Arguments go to it
# (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
exec build/apps/classify "$@"
