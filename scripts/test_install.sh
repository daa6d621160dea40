#!/usr/bin/env bash
# evenflow as another project uses it: configures and builds the libraries the way README's install
# does (shared, the default; portable: EF_NATIVE=OFF, the CPU kernels chosen at run time; the CUDA
# backend too where the toolkit is), installs them into a fresh prefix, builds
# examples/wgan_gp_critic against that install with find_package(evenflow) and runs it (two CPU
# devices), checks that the program links only evenflow's libraries (not CUDA's, cuDNN's, NCCL's or
# oneDNN's), and compiles and runs a one-file program with pkg-config's flags, which also checks
# that the copy of the CPU kernels in use is the widest this CPU runs.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD_DIR:-build-install}
prefix=$(mktemp -d /tmp/evenflow-prefix.XXXXXX)
work=$(mktemp -d /tmp/evenflow-consumer.XXXXXX)
trap 'rm -rf "$prefix" "$work"' EXIT

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DEF_NATIVE=OFF \
  -DCMAKE_INSTALL_PREFIX="$prefix" "$@" >/dev/null
libs=()
for c in engine io data layers optim losses parallel; do libs+=(--target "ef_$c"); done
cmake --build "$build" --parallel "${JOBS:-$(nproc)}" "${libs[@]}"
cmake --install "$build" >/dev/null
echo "installed into $prefix:"
(cd "$prefix" && find . -name '*.so*' -o -name '*.cmake' -o -name '*.pc' | sort | sed 's/^/  /')

echo "== examples/wgan_gp_critic with find_package(evenflow)"
cmake -S examples/wgan_gp_critic -B "$work/example" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/example" >/dev/null
needed=$(readelf -d "$work/example/wgan_gp_critic" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p')
echo "the program needs: $(echo $needed)"
for lib in $needed; do
  case "$lib" in
    libevenflow_*.so.0 | libstdc++.so.* | libm.so.* | libgcc_s.so.* | libc.so.*) ;;
    *) echo "FAIL: the program links $lib; it should need evenflow's libraries only" >&2; exit 1 ;;
  esac
done
"$work/example/wgan_gp_critic"

echo "== a program built with pkg-config's flags"
cat > "$work/sum.cpp" <<'CPP'
#include <evenflow/evenflow.h>
#include <cstdio>
int main() {
  std::printf("%s\n", evenflow::cpu_kernels_isa());
  return evenflow::sum(evenflow::ones({3})).item() == 3.0 ? 0 : 1;
}
CPP
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
# shellcheck disable=SC2046
c++ $(pkg-config --cflags evenflow) "$work/sum.cpp" -o "$work/sum" $(pkg-config --libs evenflow) \
  -Wl,-rpath,"$(pkg-config --variable=libdir evenflow)"
isa=$("$work/sum")
flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { for f in "$@"; do [[ "$flags" == *" $f "* ]] || return 1; done; }
if has avx512f avx512bw avx512cd avx512dq avx512vl; then want=avx512
elif has avx2 fma bmi2 f16c movbe; then want=avx2
else want=baseline; fi
echo "CPU kernels in use: $isa (this CPU: $want)"
[[ "$isa" == "$want" ]] || { echo "FAIL: the portable library runs the $isa kernels on a CPU that runs $want" >&2; exit 1; }
echo "install check: ok"
