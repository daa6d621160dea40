#!/usr/bin/env bash
# Sets up, builds and runs the main program. Arguments go to the program (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh
exec build/apps/train_demo "$@"
