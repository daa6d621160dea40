#!/usr/bin/env bash
# Installs the Debian packages evenflow needs to build, test and run. Idempotent: installs only
# what is missing. `--fixtures` also installs Debian's PyTorch 1.13 (what
# scripts/make_*_fixtures.py ran on; the benchmarks' PyTorch 2.15 is scripts/bench_python.sh's), `--fuzz`
# clang and libclang-rt-dev (libFuzzer's and the sanitizers' runtimes, for scripts/fuzz.sh), `--ray`
# Ray's C++ API (PyPI ray[cpp], pinned) in a venv where the build finds it (EF_RAY_VENV,
# data/ray/CMakeLists.txt), with the `ray` command that starts a cluster.
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config libeigen3-dev doctest-dev libcli11-dev
          nlohmann-json3-dev libpng-dev zlib1g-dev libbenchmark-dev clang-format dataset-fashion-mnist
          libdnnl-dev doxygen openmpi-bin libopenmpi-dev)
ray=0
for arg in "$@"; do
  case "$arg" in
    --fixtures) packages+=(python3-torch python3-numpy) ;;
    --fuzz) packages+=(clang libclang-rt-dev) ;;
    --ray) ray=1; packages+=(python3-venv) ;;
    *) echo "setup.sh: unknown argument $arg (--fixtures, --fuzz, --ray)" >&2; exit 2 ;;
  esac
done

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

# Ray 2.60.0's C++ API: the version data/ray/CMakeLists.txt expects (its C++ API changes without
# notice between releases). ~100 MB of wheels, ~10 s.
if ((ray)); then
  ray_venv=${EF_RAY_VENV:-$HOME/.cache/evenflow/ray-2.60.0}
  if ! "$ray_venv/bin/python" -c "import ray, sys; sys.exit(ray.__version__ != '2.60.0')" 2>/dev/null; then
    echo "setup: installing ray[cpp]==2.60.0 into $ray_venv"
    python3 -m venv "$ray_venv"
    "$ray_venv/bin/pip" install -q "ray[cpp]==2.60.0"
  fi
fi
