#!/usr/bin/env bash
# Fuzzes the readers of untrusted files (tests/fuzz: the safetensors loader and the IDX reader)
# with libFuzzer. Builds the targets with clang, AddressSanitizer and UBSan into build-fuzz/ (CPU
# only: the engine and the readers, nothing else), then runs the fuzzers side by side, each for a
# bounded time on a copy of its seed corpus (tests/fuzz/corpus/<target>/), so the repository is
# not modified. An input that ends in anything but success or an ef::Error naming the input (a
# crash, another exception, an internal error, a leak, undefined behaviour, a timeout or running
# out of memory) is a finding: that fuzzer stops, the input is kept in
# build-fuzz/findings/<target>/, and the script exits 1 after printing one line per target.
# Reproduce one with `build-fuzz/tests/fuzz/fuzz_<target> <file>`.
#
#   FUZZ_SECONDS   seconds per target (default 60)
#   FUZZ_TARGETS   targets to run (default "safetensors idx")
#   BUILD_DIR      build folder (default build-fuzz); JOBS: build jobs (default nproc)
#
# Packages: scripts/setup.sh --clang's (its own plus clang 16 and libclang-rt-16-dev, Debian's
# compiler-rt: libFuzzer's runtime libclang_rt.fuzzer*.a and the sanitizer runtimes).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --clang

build_dir=${BUILD_DIR:-build-fuzz}
seconds=${FUZZ_SECONDS:-60}
read -r -a targets <<<"${FUZZ_TARGETS:-safetensors idx}"

echo "== build (clang 16, libFuzzer, AddressSanitizer + UBSan) in $build_dir"
# -O1 without NDEBUG: fast enough to fuzz, and the assertions of nlohmann/json and Eigen stay on;
# line tables are enough for the stack traces of findings and compile much faster than -g.
# OpenMP off (the readers do not use it); no test suites.
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_CXX_COMPILER=clang++-16 -DCMAKE_BUILD_TYPE=Debug -DEF_SHARED=OFF \
  -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" -DEF_FUZZ=ON -DEF_SANITIZE=address -DEF_CUDA=OFF -DEF_OPENMP=OFF \
  -DBUILD_TESTING=OFF -DEF_RAY=OFF >/dev/null
build_targets=()
for t in "${targets[@]}"; do build_targets+=(--target "fuzz_$t"); done
cmake --build "$build_dir" --parallel "${JOBS:-$(nproc)}" "${build_targets[@]}"

echo "== $(printf 'fuzz_%s ' "${targets[@]}")for ${seconds} s each, side by side"
pids=()
# Background jobs of a script ignore Ctrl-C: stop them with the script.
trap 'kill "${pids[@]}" 2>/dev/null; exit 130' INT TERM
for t in "${targets[@]}"; do
  corpus="$build_dir/corpus/$t" findings="$build_dir/findings/$t"
  rm -rf "$corpus" "$findings"
  mkdir -p "$corpus" "$findings"
  cp tests/fuzz/corpus/"$t"/* "$corpus"/
  # Inputs up to 4 KB hold every structure of both formats (the seeds are smaller); 10 s for one
  # input or 2 GB of memory is a hang or a blow-up, not a slow read.
  ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    "$build_dir/tests/fuzz/fuzz_$t" -max_total_time="$seconds" -rss_limit_mb=2048 -max_len=4096 -timeout=10 \
    -print_final_stats=1 -artifact_prefix="$findings/" "$corpus" >"$build_dir/fuzz_$t.log" 2>&1 &
  pids+=($!)
done

summaries=()
failed=0
for i in "${!targets[@]}"; do
  t=${targets[$i]} findings="$build_dir/findings/${targets[$i]}" log="$build_dir/fuzz_${targets[$i]}.log"
  status=0
  wait "${pids[$i]}" || status=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 || true)
  corp=$(grep -oE 'corp: [0-9]+' "$log" | tail -1 | cut -d' ' -f2 || true)
  seeds=$(find tests/fuzz/corpus/"$t" -type f | wc -l)
  if [[ $status -eq 0 ]]; then
    summaries+=("fuzz_$t: ok, ${runs:-?} inputs in ${seconds} s (${rate:-?}/s), ${cov:-cov: ?}, corpus $seeds -> ${corp:-?}")
  else
    failed=1
    summaries+=("fuzz_$t: FINDING (exit $status): $(ls "$findings" | tr '\n' ' ')in $findings, log $log")
    grep -E 'ERROR|unexpected ef::Error|runtime error|terminate called|SUMMARY' "$log" | head -5 || true
  fi
done

echo "== summary"
printf '%s\n' "${summaries[@]}"
exit $failed
