#!/usr/bin/env bash
# Builds the package a user downloads: evenflow-<version>-linux-x86_64.tar.gz in --out, a portable
# build (EF_NATIVE=OFF: the CPU kernels for AVX-512, AVX2 and any x86-64, the widest the CPU has
# chosen when a program starts) of the shared libraries, their headers, CMake package and
# pkg-config file, oneDNN beside them, and the programs wgan_gp, classify and segment. Nothing in it
# names a folder of the machine that built it: unpack it anywhere (docs/install.md, "From the
# package"). Without --cuda the package has no CUDA backend and needs no CUDA library; with it,
# the kernels for every architecture CMakeLists.txt lists (or CMAKE_ARGS' -DCMAKE_CUDA_ARCHITECTURES)
# and the name ends in -cuda<major>, and the machine that runs it needs CUDA's runtime, cuBLAS, cuDNN
# and NCCL libraries.
#
#   bash scripts/package.sh --out DIR [--cuda] [--build BUILD_DIR] [CMAKE_ARGS...]
#
# Prints the tarball's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/.."
out="" cuda=OFF build=build-package
while (($#)); do
  case $1 in
    --out) out=$2; shift 2 ;;
    --cuda) cuda=ON; shift ;;
    --build) build=$2; shift 2 ;;
    *) break ;;
  esac
done
[[ -n $out ]] || { echo "package.sh: --out DIR is required" >&2; exit 2; }
version=$(sed -n 's/^project(evenflow VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
name=evenflow-$version-linux-x86_64
if [[ $cuda == ON ]]; then name+=-cuda$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p'); fi

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DEF_NATIVE=OFF -DEF_SHARED=ON \
  -DEF_CUDA=$cuda -DEF_RAY=OFF -DCMAKE_INSTALL_PREFIX="/$name" "$@" >/dev/null
targets=()
for t in ef_engine ef_io ef_data ef_layers ef_optim ef_losses ef_parallel wgan_gp classify segment; do
  targets+=(--target "$t")
done
cmake --build "$build" --parallel "${JOBS:-$(nproc)}" "${targets[@]}"
stage=$(mktemp -d /tmp/evenflow-package.XXXXXX)
trap 'rm -rf "$stage"' EXIT
# Prefix /<name> under DESTDIR: lib/, include/, bin/ (a prefix of / would become /usr/... by
# GNUInstallDirs' rule for it).
DESTDIR="$stage" cmake --install "$build" >/dev/null
# A folder of the building machine in a run path, the CMake files or the pkg-config file would
# break the package elsewhere. (Source paths in assertion messages are only text.)
bad=0
while IFS= read -r -d '' f; do
  if readelf -h "$f" >/dev/null 2>&1; then
    paths=$(readelf -d "$f" | sed -n 's/.*R\(UN\)\?PATH.*\[\(.*\)\]/\2/p')
    for p in ${paths//:/ }; do
      [[ $p == '$ORIGIN'* ]] || { echo "package.sh: $f has the run path $p" >&2; bad=1; }
    done
  elif grep -q -e "$PWD" -e "$HOME" "$f"; then
    echo "package.sh: $f names a folder of this machine" >&2
    bad=1
  fi
done < <(find "$stage/$name" -type f -print0)
((bad == 0)) || exit 1
mkdir -p "$out"
tar -C "$stage" -czf "$out/$name.tar.gz" "$name"
echo "$(cd "$out" && pwd)/$name.tar.gz"
