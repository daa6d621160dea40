#!/usr/bin/env bash
# evenflow as another project uses it, twice: a build with the CUDA backend (where the toolkit is)
# and a CPU-only one (EF_CUDA=OFF). Each is configured the way README's install is (shared
# libraries, portable: EF_NATIVE=OFF, the CPU kernels chosen at run time) and installed into a fresh
# prefix. Then examples/wgan_gp_critic is built against it with nothing but
# -DCMAKE_PREFIX_PATH=<prefix> and run on cpu:2 and cpu:1 in float64 (the losses must agree to
# 1e-10); the program must need no library but evenflow's (and the CPU-only install none of CUDA's
# at all); and a one-file program built with pkg-config's flags must run and report the widest
# copy of the CPU kernels this CPU supports. Extra arguments go to both configure steps.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/evenflow-install.XXXXXX)
trap 'rm -rf "$work"' EXIT

flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { for f in "$@"; do [[ "$flags" == *" $f "* ]] || return 1; done; }
if has avx512f avx512bw avx512cd avx512dq avx512vl; then want_isa=avx512
elif has avx2 fma bmi2 f16c movbe; then want_isa=avx2
else want_isa=baseline; fi

# check NAME BUILD_DIR CMAKE_ARGS...
check() {
  local name=$1 build=$2
  shift 2
  local prefix=$work/$name/prefix
  echo "== $name: build, install into $prefix"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_TESTING=OFF -DEF_NATIVE=OFF \
    -DCMAKE_INSTALL_PREFIX="$prefix" "$@" >/dev/null
  local libs=()
  for c in engine io data layers optim losses parallel; do libs+=(--target "ef_$c"); done
  cmake --build "$build" --parallel "${JOBS:-$(nproc)}" "${libs[@]}" >/dev/null
  cmake --install "$build" >/dev/null
  (cd "$prefix" && find . -name '*.so.*.*' -o -name '*.cmake' -o -name '*.pc' | sort | tr '\n' ' ')
  echo

  echo "== $name: examples/wgan_gp_critic with find_package(evenflow)"
  local example=$work/$name/example
  cmake -S examples/wgan_gp_critic -B "$example" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  cmake --build "$example" >/dev/null
  local needed
  needed=$(readelf -d "$example/wgan_gp_critic" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p' | tr '\n' ' ')
  echo "the program needs: $needed"
  for lib in $needed; do
    case "$lib" in
      libevenflow_*.so.0 | libstdc++.so.* | libm.so.* | libgcc_s.so.* | libc.so.*) ;;
      *) echo "FAIL: the program links $lib; it should need evenflow's libraries only" >&2; exit 1 ;;
    esac
  done
  if [[ "$name" == cpu-only ]] && ldd "$example/wgan_gp_critic" | grep -Ei 'cuda|cublas|cudnn|nccl'; then
    echo "FAIL: the CPU-only install loads a CUDA library" >&2
    exit 1
  fi
  "$example/wgan_gp_critic" cpu:2 float64 | tee "$work/$name/two"
  "$example/wgan_gp_critic" cpu:1 float64 > "$work/$name/one"
  # The losses (4th column) of every printed step: two devices against one, float64.
  paste <(awk '{print $5}' "$work/$name/two") <(awk '{print $5}' "$work/$name/one") | awk '
    { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-10 || $1 == "" || $2 == "") bad = 1; n++ }
    END { if (bad || n != 5) { print "FAIL: the losses on cpu:2 and cpu:1 differ"; exit 1 }
          print "losses on cpu:2 equal those on cpu:1 (float64, 1e-10)" }'

  echo "== $name: a program built with pkg-config's flags"
  cat > "$work/$name/sum.cpp" <<'CPP'
#include <evenflow/evenflow.h>
#include <cstdio>
int main() {
  std::printf("%s\n", evenflow::cpu_kernels_isa());
  return evenflow::sum(evenflow::ones({3})).item() == 3.0 ? 0 : 1;
}
CPP
  local pc=(env PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config)
  # shellcheck disable=SC2046
  c++ $("${pc[@]}" --cflags evenflow) "$work/$name/sum.cpp" -o "$work/$name/sum" $("${pc[@]}" --libs evenflow) \
    -Wl,-rpath,"$prefix/lib"
  local isa
  isa=$("$work/$name/sum")
  echo "CPU kernels in use: $isa (this CPU runs: $want_isa)"
  [[ "$isa" == "$want_isa" ]] || { echo "FAIL: the portable library runs the $isa kernels" >&2; exit 1; }
}

check cuda "${BUILD_DIR:-build-install}" "$@"
check cpu-only "${BUILD_DIR:-build-install}-cpu" -DEF_CUDA=OFF "$@"
echo "install check: ok"
