#!/usr/bin/env bash
# Installs the Debian packages evenflow needs to build, test and run. Idempotent: installs only
# what is missing. `--fixtures` also installs Debian's PyTorch 1.13 (what
# scripts/make_*_fixtures.py ran on; the benchmarks' PyTorch 2.15 is scripts/bench_python.sh's), `--fuzz`
# clang and libclang-rt-dev (libFuzzer's and the sanitizers' runtimes, for scripts/fuzz.sh), `--ray`
# Ray's C++ API (PyPI ray[cpp], pinned) in a venv where the build finds it (EF_RAY_VENV,
# cmake/ray.cmake), with the `ray` command that starts a cluster, `--tensorboard` PyPI tensorboard in a
# venv (what tests/ reads the programs' event files back with: scripts/check_tensorboard.py).
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config libeigen3-dev doctest-dev libcli11-dev
          nlohmann-json3-dev libpng-dev zlib1g-dev libbenchmark-dev clang-format dataset-fashion-mnist
          libdnnl-dev doxygen openmpi-bin libopenmpi-dev)
ray=0 tensorboard=0
for arg in "$@"; do
  case "$arg" in
    --fixtures) packages+=(python3-torch python3-numpy) ;;
    --fuzz) packages+=(clang libclang-rt-dev) ;;
    --ray) ray=1; packages+=(python3-venv) ;;
    --tensorboard) tensorboard=1; packages+=(python3-venv) ;;
    *) echo "setup.sh: unknown argument $arg (--fixtures, --fuzz, --ray, --tensorboard)" >&2; exit 2 ;;
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

# Ray 2.60.0's C++ API: the version cmake/ray.cmake expects (its C++ API changes without
# notice between releases). ~100 MB of wheels, ~10 s.
if ((ray)); then
  ray_venv=${EF_RAY_VENV:-$HOME/.cache/evenflow/ray-2.60.0}
  if ! "$ray_venv/bin/python" -c "import ray, sys; sys.exit(ray.__version__ != '2.60.0')" 2>/dev/null; then
    echo "setup: installing ray[cpp]==2.60.0 into $ray_venv"
    python3 -m venv "$ray_venv"
    "$ray_venv/bin/pip" install -q "ray[cpp]==2.60.0"
  fi
fi

# TensorBoard 2.21.0, whose reader the tests check the event files with (cmake: EF_TENSORBOARD_PYTHON).
if ((tensorboard)); then
  tb_venv=${EF_TENSORBOARD_VENV:-$HOME/.cache/evenflow/tensorboard-2.21.0}
  if ! "$tb_venv/bin/python" -c "import tensorboard, sys; sys.exit(tensorboard.__version__ != '2.21.0')" 2>/dev/null; then
    echo "setup: installing tensorboard==2.21.0 into $tb_venv"
    python3 -m venv "$tb_venv"
    "$tb_venv/bin/pip" install -q "tensorboard==2.21.0"
  fi
fi
