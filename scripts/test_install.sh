#!/usr/bin/env bash
# evenflow as another project uses it, twice: BUILD_DIR's libraries (a build configured shared,
# EF_SHARED=ON, and for this machine, EF_NATIVE=ON, with the CUDA backend where the toolkit is, as
# CI's Release build is: the CPU kernels compiled once, as a developer installs what they built
# here), installed into a fresh prefix; and the package a user downloads (scripts/package.sh:
# portable, EF_NATIVE=OFF, the CPU kernels for three instruction sets chosen at run time, no CUDA,
# the programs), unpacked into a new folder and used with HOME elsewhere and its build tree moved
# away. Against each, examples/wgan_gp_critic is built with nothing but
# -DCMAKE_PREFIX_PATH=<prefix> and run on cpu:2 and cpu:1 in float64 (the losses must agree to
# 1e-10), and so is examples/data_parallel (the README's example: cpu:2 against cpu:1, and a run
# saved after 10 steps on cpu:3 resumed on cpu:1 against an unbroken one); the program must need no
# library but evenflow's (and the package's none of CUDA's at all); in the package the narrower
# copies of the CPU kernels (forced with EF_CPU_KERNELS) must give the same losses, and wgan_gp
# --version must name the widest this CPU runs; and a one-file program built with pkg-config's flags
# must run and report the CPU kernels in use: that widest copy in the package, "native" otherwise.
# CMAKE_ARGS go to the package's configure step.
#
#   bash scripts/test_install.sh --from BUILD_DIR [CMAKE_ARGS...]
set -euo pipefail
cd "$(dirname "$0")/.."
[[ ${1:-} == --from && -n ${2:-} ]] ||
  { echo "usage: scripts/test_install.sh --from BUILD_DIR [CMAKE_ARGS...] (a shared, native build: scripts/test.sh makes one)" >&2; exit 2; }
build=$2
shift 2
cache() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt"; }
[[ -f $build/CMakeCache.txt && $(cache EF_SHARED) == ON && $(cache EF_NATIVE) == ON ]] ||
  { echo "test_install.sh: --from $build needs a build configured with EF_SHARED=ON and EF_NATIVE=ON" >&2; exit 2; }
work=$(mktemp -d /tmp/evenflow-install.XXXXXX)
trap 'rm -rf "$work"' EXIT

flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
has() { for f in "$@"; do [[ "$flags" == *" $f "* ]] || return 1; done; }
if has avx512f avx512bw avx512cd avx512dq avx512vl; then want_isa=avx512
elif has avx2 fma bmi2 f16c movbe; then want_isa=avx2
else want_isa=baseline; fi
case $want_isa in
  avx512) narrower_isas=(avx2 baseline) ;;
  avx2) narrower_isas=(baseline) ;;
  *) narrower_isas=() ;;
esac

# same_losses FILE_A FILE_B WHAT: the losses (5th column) of every printed step agree to 1e-10.
same_losses() {
  paste <(awk '{print $5}' "$1") <(awk '{print $5}' "$2") | awk -v what="$3" '
    { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-10 || $1 == "" || $2 == "") bad = 1; n++ }
    END { if (bad || n != 5) { print "FAIL: the losses " what ": no"; exit 1 }
          print "losses " what " (float64, 1e-10)" }'
}

# check NAME PREFIX portable|native: what a project using the install at PREFIX sees.
check() {
  local name=$1 prefix=$2 kind=$3
  local isas=("${narrower_isas[@]}") expect_isa=$want_isa
  if [[ $kind == native ]]; then isas=() expect_isa=native; fi
  mkdir -p "$work/$name"
  (cd "$prefix" && find . -name '*.so.*' -o -name '*.cmake' -o -name '*.pc' -o -path './bin/*' | sort | tr '\n' ' ')
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
  same_losses "$work/$name/two" "$work/$name/one" "on cpu:2 equal those on cpu:1"
  # The narrower copies of the CPU kernels, which this CPU would not pick by itself.
  local isa
  for isa in "${isas[@]}"; do
    EF_CPU_KERNELS=$isa "$example/wgan_gp_critic" cpu:2 float64 > "$work/$name/$isa"
    same_losses "$work/$name/$isa" "$work/$name/one" "with the $isa kernels (EF_CPU_KERNELS) equal the default's"
  done

  echo "== $name: examples/data_parallel (the README's example) with find_package(evenflow)"
  local dp=$work/$name/data_parallel
  cmake -S examples/data_parallel -B "$dp" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
  cmake --build "$dp" >/dev/null
  (
    cd "$work/$name"
    "$dp/data_parallel" cpu:2 20 two.safetensors | tee dp_two
    "$dp/data_parallel" cpu:1 20 one.safetensors > dp_one
    "$dp/data_parallel" cpu:3 10 resumed.safetensors > dp_resumed  # 10 steps on 3 devices, then
    "$dp/data_parallel" cpu:1 20 resumed.safetensors >> dp_resumed  # resumed on 1 for 10 more
  )
  same_example_losses() {
    paste <(awk '{print $4}' "$1") <(awk '{print $4}' "$2") | awk -v what="$3" '
      { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-10 || $1 == "" || $2 == "") bad = 1; n++ }
      END { if (bad || n != 4) { print "FAIL: the losses " what ": no"; exit 1 }
            print "losses " what " (float64, 1e-10)" }'
  }
  same_example_losses "$work/$name/dp_two" "$work/$name/dp_one" "on cpu:2 equal those on cpu:1"
  same_example_losses "$work/$name/dp_resumed" "$work/$name/dp_one" "of 10 steps on cpu:3 resumed on cpu:1 equal an unbroken run"

  echo "== $name: a program built with pkg-config's flags"
  cat > "$work/$name/sum.cpp" <<'CPP'
#include <evenflow/evenflow.h>
#include <cstdio>
int main() try {
  std::printf("%s\n", evenflow::cpu_kernels_isa());
  return evenflow::sum(evenflow::ones({3})).item() == 3.0 ? 0 : 1;
} catch (const evenflow::Error& e) {
  std::fprintf(stderr, "%s\n", e.what());
  return 2;
}
CPP
  local pc=(env PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config)
  # shellcheck disable=SC2046
  c++ $("${pc[@]}" --cflags evenflow) "$work/$name/sum.cpp" -o "$work/$name/sum" $("${pc[@]}" --libs evenflow) \
    -Wl,-rpath,"$prefix/lib"
  isa=$("$work/$name/sum")
  echo "CPU kernels in use: $isa (expected: $expect_isa)"
  [[ "$isa" == "$expect_isa" ]] || { echo "FAIL: the $kind library runs the $isa kernels" >&2; exit 1; }
  [[ $kind == portable ]] || return 0
  echo "== $name: the packaged program's --version"
  "$prefix/bin/wgan_gp" --version | tee "$work/$name/version"
  grep -q "^CPU kernels: $expect_isa " "$work/$name/version" ||
    { echo "FAIL: wgan_gp --version does not name the $expect_isa kernels" >&2; exit 1; }
  for isa in "${isas[@]}"; do
    [[ $(EF_CPU_KERNELS=$isa "$work/$name/sum") == "$isa" ]] || { echo "FAIL: EF_CPU_KERNELS=$isa ignored" >&2; exit 1; }
  done
  if EF_CPU_KERNELS=sse9 "$work/$name/sum" 2>"$work/$name/err"; then
    echo "FAIL: EF_CPU_KERNELS=sse9 accepted" >&2; exit 1
  fi
  grep -q "EF_CPU_KERNELS=sse9: expected avx512, avx2 or baseline" "$work/$name/err" ||
    { echo "FAIL: EF_CPU_KERNELS=sse9 gave: $(cat "$work/$name/err")" >&2; exit 1; }
}

echo "== cuda: the libraries built for this machine (native CPU kernels, the CUDA backend) in $build, installed"
cmake --install "$build" --prefix "$work/cuda/prefix" >/dev/null
check cuda "$work/cuda/prefix" native

# The package a user downloads (scripts/package.sh: portable CPU kernels, no CUDA, the programs),
# unpacked into a new folder, and used with HOME elsewhere and the build tree moved away: nothing
# may reach back to the machine's folders.
echo "== cpu-only: the package (scripts/package.sh), unpacked into a new folder"
package_build=build-install-cpu
tarball=$(bash scripts/package.sh --out "$work/package" --build "$package_build" "$@" | tail -1)
echo "$tarball: $(du -h "$tarball" | cut -f1)"
mkdir -p "$work/unpacked" "$work/home"
tar -C "$work/unpacked" -xzf "$tarball"
mv "$package_build" "$work/build-moved"
trap 'mv "$work/build-moved" "$package_build" 2>/dev/null; rm -rf "$work"' EXIT
(export HOME=$work/home && unset LD_LIBRARY_PATH && check cpu-only "$work/unpacked/$(basename "$tarball" .tar.gz)" portable)
echo "install check: ok"
