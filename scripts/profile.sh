#!/usr/bin/env bash
# Where a program's CPU time goes, by kind of work: runs it under `perf record` with a software
# clock (no hardware counters needed, so it works in VMs) and call stacks, then sorts the samples
# with scripts/profile_categories.py. Usage: scripts/profile.sh PROGRAM [ARGS...]
#   e.g. scripts/profile.sh build/apps/classify --epochs 1 --steps 300 --out /tmp/p --overwrite
# Shares are of CPU time summed over threads (a thread waiting asleep is not sampled).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v perf >/dev/null; then
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends linux-perf
fi
data=$(mktemp)
trap 'rm -f "$data"' EXIT
perf record -q -e cpu-clock -F 999 -g -o "$data" -- "$@" >&2
perf script -i "$data" -F ip,sym,dso 2>/dev/null | python3 scripts/profile_categories.py
