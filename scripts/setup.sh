#!/usr/bin/env bash
# Installs the Debian packages evenflow needs to build, test and run. Idempotent: installs only
# what is missing. `--fixtures` also installs Debian's PyTorch 1.13 (what
# scripts/make_*_fixtures.py ran on; the benchmarks' PyTorch 2.15 is scripts/bench_python.sh's), `--fuzz`
# clang and libclang-rt-dev (libFuzzer's and the sanitizers' runtimes, for scripts/fuzz.sh).
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config libeigen3-dev doctest-dev libcli11-dev
          nlohmann-json3-dev libpng-dev zlib1g-dev libbenchmark-dev clang-format dataset-fashion-mnist
          libdnnl-dev doxygen openmpi-bin libopenmpi-dev)
if [[ "${1:-}" == "--fixtures" ]]; then packages+=(python3-torch python3-numpy); fi
if [[ "${1:-}" == "--fuzz" ]]; then packages+=(clang libclang-rt-dev); fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
