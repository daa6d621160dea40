#!/usr/bin/env bash
# Installs the Debian packages evenflow needs to build, test and run, and oneDNN 3.2 (Intel's OpenMP
# build from PyPI, onednn-cpu-gomp; Debian has 2.6) in ~/.cache/evenflow/onednn-3.2 where the build
# finds it (EF_ONEDNN_ROOT). Idempotent: installs only what is missing. Options:
#   --fixtures     Debian's PyTorch 1.13 (what scripts/make_*_fixtures.py ran on; the benchmarks'
#                  PyTorch 2.15 is scripts/bench_python.sh's)
#   --clang        clang 16 with its sanitizer and libFuzzer runtimes and its OpenMP: what the
#                  sanitizer builds of scripts/test.sh and scripts/fuzz.sh compile with
#   --ray          Ray's C++ API (PyPI ray[cpp], pinned) in a venv where the build finds it
#                  (EF_RAY_VENV, cmake/ray.cmake), with the `ray` command that starts a cluster
#   --safetensors  Debian's PyTorch 1.13 and PyPI safetensors (pinned) in a venv that sees it: what
#                  tests/io/test_safetensors.cpp cross-checks our files with (safetensors.torch)
#   --tensorboard  PyPI tensorboard in a venv (what tests/ reads the programs' event files back with:
#                  scripts/check_tensorboard.py)
set -euo pipefail

packages=(build-essential cmake ninja-build pkg-config libeigen3-dev doctest-dev libcli11-dev
          nlohmann-json3-dev libpng-dev zlib1g-dev libbenchmark-dev clang-format dataset-fashion-mnist
          python3-pip doxygen openmpi-bin libopenmpi-dev)
ray=0 safetensors=0 tensorboard=0
for arg in "$@"; do
  case "$arg" in
    --fixtures) packages+=(python3-torch python3-numpy) ;;
    --clang) packages+=(clang-16 libclang-rt-16-dev libomp-16-dev) ;;
    --ray) ray=1; packages+=(python3-venv) ;;
    --safetensors) safetensors=1; packages+=(python3-torch python3-venv) ;;
    --tensorboard) tensorboard=1; packages+=(python3-venv) ;;
    *) echo "setup.sh: unknown argument $arg (--clang, --fixtures, --ray, --safetensors, --tensorboard)" >&2; exit 2 ;;
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

# oneDNN 3.2 (CMakeLists.txt: EF_ONEDNN_ROOT): the wheels' lib/ and include/, ~55 MB, ~5 s.
onednn_version=2023.2.0  # oneDNN 3.2, the newest OpenMP build on PyPI (later ones are SYCL/TBB builds)
onednn_root=${EF_ONEDNN_ROOT:-$HOME/.cache/evenflow/onednn-3.2}
if [[ ! -f $onednn_root/lib/libdnnl.so.3 || ! -f $onednn_root/include/oneapi/dnnl/dnnl.hpp ]]; then
  echo "setup: installing oneDNN 3.2 (onednn-cpu-gomp==$onednn_version) into $onednn_root"
  wheels=$(mktemp -d)
  python3 -m pip download -q --no-deps --dest "$wheels" "onednn-cpu-gomp==$onednn_version" \
    "onednn-devel-cpu-gomp==$onednn_version"
  for wheel in "$wheels"/*.whl; do python3 -m zipfile -e "$wheel" "$wheels/unpacked"; done
  rm -rf "$onednn_root" && mkdir -p "$onednn_root"
  # The wheel holds three copies of the library; its soname is libdnnl.so.3.
  mkdir "$onednn_root/lib"
  cp "$wheels/unpacked/onednn_cpu_gomp-$onednn_version.data/data/lib/libdnnl.so.3" "$onednn_root/lib/"
  ln -s libdnnl.so.3 "$onednn_root/lib/libdnnl.so"
  cp -r "$wheels/unpacked/onednn_devel_cpu_gomp-$onednn_version.data/data/include" "$onednn_root/"
  rm -rf "$wheels"
fi

# A Python venv at $1 with the pinned package $3 whose module $2 reports version $4, made once; any
# further arguments go to `venv` (the venv is made by Debian's python3, whose packages it may see).
pinned_venv() {
  local venv=$1 module=$2 requirement=$3 version=$4
  shift 4
  if ! "$venv/bin/python" -c "import $module, sys; sys.exit($module.__version__ != '$version')" 2>/dev/null; then
    echo "setup: installing $requirement into $venv"
    /usr/bin/python3 -m venv "$@" "$venv"
    "$venv/bin/pip" install -q "$requirement"
  fi
}

# Ray 2.60.0's C++ API: the version cmake/ray.cmake expects (its C++ API changes without
# notice between releases). ~100 MB of wheels, ~10 s.
if ((ray)); then
  pinned_venv "${EF_RAY_VENV:-$HOME/.cache/evenflow/ray-2.60.0}" ray "ray[cpp]==2.60.0" 2.60.0
fi

# safetensors 0.8.0 beside Debian's PyTorch 1.13 (python3-torch; PyPI's torch is ~3 GB with CUDA's
# libraries): the reference reader and writer our safetensors files are cross-checked with
# (cmake: EF_SAFETENSORS_PYTHON). ~1 MB from PyPI; the Debian packages ~1.5 min.
if ((safetensors)); then
  pinned_venv "${EF_SAFETENSORS_VENV:-$HOME/.cache/evenflow/safetensors-0.8.0}" safetensors "safetensors==0.8.0" 0.8.0 \
    --system-site-packages
fi

# TensorBoard 2.21.0, whose reader the tests check the event files with (cmake: EF_TENSORBOARD_PYTHON).
if ((tensorboard)); then
  pinned_venv "${EF_TENSORBOARD_VENV:-$HOME/.cache/evenflow/tensorboard-2.21.0}" tensorboard "tensorboard==2.21.0" 2.21.0
fi
