#!/usr/bin/env bash
# Sets up, builds and runs every test: the formatting check, the API reference (no undocumented
# public declaration), the full suite (CUDA compiled and linked, Ray built in and its tests run on a
# local cluster they start, warnings as errors), the GPU check's preparation (scripts/gpu_check.sh
# --prepare: a rehearsal of the GPU build), the installs and the example project, the threaded tests
# again under ThreadSanitizer, the CPU suite (the programs' bad-input table included) under
# AddressSanitizer + UBSan, and the readers of untrusted files under libFuzzer (60 s each). CUDA
# tests skip, saying why, where no GPU is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each stage's heading says how long the script has run, for docs/contributing.md's CI timings.
stage() { printf '== [%d:%02d] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }
bash scripts/setup.sh --ray --safetensors --tensorboard

stage "format check"
git ls-files '*.h' '*.cpp' '*.cu' '*.cuh' | xargs clang-format --dry-run -Werror

stage "API reference (Doxygen; any warning fails)"
bash scripts/docs.sh

# CI compiles the CUDA kernels for one architecture, Hopper's (what the GPU check runs), not the
# seven of a default build (CMakeLists.txt): nothing here runs them, and each costs nvcc time. Its
# libraries are shared, as an install's are: the installs stage below installs this build rather
# than compiling the libraries and their CUDA kernels again.
stage "build (Release, shared libraries, warnings as errors; with Ray: the Ray tests start a local cluster)"
BUILD_DIR=build bash scripts/build.sh -DEF_WERROR=ON -DEF_RAY=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DEF_SHARED=ON
stage "tests"
(cd build && ctest --output-on-failure --timeout 900 -j "$(nproc)")

# The GPU check selects its CUDA tests by name and expects how many (run_tests in gpu_check.sh: a
# suite that failed to build there cannot drop its tests unseen); counted here in the full build, so
# a CUDA test added without its count fails now and not in a GPU window. (A test in a suite the GPU
# check does not build counts here, not there: that window's stage then fails, naming the count.)
stage "the GPU check's test selections, counted in this build"
sed -nE "s/.*run_tests '([^']+)' ([0-9]+) .*/\2 \1/p" scripts/gpu_check.sh | while read -r expected regex; do
  found=$(ctest --test-dir build -N -R "$regex" | sed -n 's/^Total Tests: //p')
  echo "'$regex': $found tests, gpu_check.sh expects $expected"
  [[ "$found" == "$expected" ]] || { echo "scripts/gpu_check.sh: update the count of '$regex'" >&2; exit 1; }
done

stage "the GPU check's preparation, rehearsed: the GPU build against build-deps/ alone (docs/gpu.md)"
bash scripts/gpu_check.sh --prepare
# Its profile stage's arithmetic (a kernel's time a step from two ncu records), on a made-up record.
python3 scripts/ncu_kernels.py --self-test
# Its speed stage's tables (scripts/bench_engine.sh: both sides' rates by case, the rounds' medians),
# on made-up sides.
bash scripts/bench_engine.sh --self-test

# Everything above builds one CUDA architecture; a user's first build has them all (CMakeLists.txt).
# Their list reaches --version as a definition, which is where a default configuration differs:
# configured as a user does, and that one file compiled (seconds; the kernels themselves were
# compiled for all seven by hand: docs/install.md).
stage "the default configuration (every CUDA architecture): configured, and --version's file compiled"
cmake -S . -B build-default -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C build-default apps/CMakeFiles/ef_apps_program.dir/common/program.cpp.o >/dev/null

stage "installs (the build above, with CUDA; the portable package, unpacked elsewhere) and the example projects built against each"
bash scripts/test_install.sh --from build

# The sanitizer builds compile with clang 16, so that CI builds and tests the library with both
# compilers a user may have (the Release build's is GCC 12; clang's code for elu once lost -0's
# sign), and because its sanitizer stages are shorter; at -O1 with line tables only (-g1), what the
# sanitizers' reports need (file and line of every frame), at half the compile time of -O2 -g. The
# figures: docs/contributing.md, "What keeps it short".
stage "clang 16 (scripts/setup.sh --clang)"
bash scripts/setup.sh --clang
sanitizer_flags=(-DCMAKE_CXX_COMPILER=clang++-16 "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG")

stage "engine, data-loader and parallel tests (devices, workers, collectives) under ThreadSanitizer"
BUILD_DIR=build-tsan BUILD_TYPE=RelWithDebInfo TARGETS="test_engine test_data test_parallel test_processes" \
  bash scripts/build.sh "${sanitizer_flags[@]}" -DEF_SANITIZE=thread -DEF_OPENMP=OFF -DEF_CUDA=OFF -DEF_MPI=ON \
  -DEF_RAY=OFF -DEF_WERROR=ON
# Every test case of the four suites in its own process, two at a time (ctest: 2 minutes against 3.6
# for the suites run one after another, 2-core Zen 4; docs/contributing.md): so the thread cases
# run, as they must, in a process where no CPU worker has started yet -- backward passes then run on
# their calling threads (Note [Backward on the calling thread]). The suites this build leaves out
# are listed as NOT_BUILT. test_processes runs under mpirun (its CTest entries, on 2 and 3
# processes); Open MPI's own libraries are not instrumented, so reports inside them are suppressed.
tsan_options="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/tests/sanitizers/tsan_mpi.supp"
(cd build-tsan && TSAN_OPTIONS="$tsan_options" ctest --output-on-failure --timeout 900 -j "$(nproc)" -E '_NOT_BUILT')

stage "CPU tests under AddressSanitizer + UndefinedBehaviorSanitizer"
# Without MPI: Open MPI's own allocations, alive at exit by design, would read as leaks. The
# multi-process tests run in the Release build above.
BUILD_DIR=build-asan BUILD_TYPE=RelWithDebInfo bash scripts/build.sh "${sanitizer_flags[@]}" -DEF_SANITIZE=address \
  -DEF_CUDA=OFF -DEF_WERROR=ON -DEF_MPI=OFF -DEF_RAY=OFF
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure --timeout 900 -j "$(nproc)")

stage "safetensors and IDX readers under libFuzzer (AddressSanitizer + UBSan)"
FUZZ_SECONDS=${FUZZ_SECONDS:-60} bash scripts/fuzz.sh
stage "done"
