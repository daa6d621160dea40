#!/usr/bin/env bash
# Runs apps/bench_engine and the same cases in PyTorch, one after the other in this run, with the
# same thread count, and prints both rates and the ratio (evenflow time / PyTorch time; < 1 means
# evenflow is faster). Usage: scripts/bench_engine.sh [cpu|cuda] [threads], or --self-test (below).
# PYTHON=... picks PyTorch's interpreter; the default on CPU is PyTorch 2.15 from PyPI
# (scripts/bench_python.sh makes its venv), on CUDA the machine's python3. BUILD_DIR (default build),
# MIN_SECONDS (per case, default 1), TF32 (conv, the default of both, all or none: the same on
# both sides) and PRECISION (fp32, or bf16: the matmul and conv cases in bfloat16, PyTorch's under
# torch.autocast) from the environment.
#
# ROUNDS=N (default 1) runs the two sides N times, alternating (evenflow, PyTorch, evenflow, ...), so
# that a VM's swings from minute to minute fall on both: each rate is then the median of its N, and
# the ratio the median of the N rounds' ratios, with their lowest and highest beside it. On the
# 2-core VMs we measure on, one run's ratio moved by up to 1.5x from run to run (docs/benchmarks.md,
# "The table in rounds").
#
# On CPU, PyTorch runs with glibc's mmap and trim thresholds fixed at 4 GiB (MALLOC_MMAP_THRESHOLD_,
# MALLOC_TRIM_THRESHOLD_), so that its outputs of 32 MiB come from memory it freed before, as ours
# come from our allocator's cache. With glibc's defaults they were mapped from the OS at every call
# in some processes and not in others (the dynamic threshold tops out at 32 MiB): PyTorch's
# layer_norm_8192x1024 forward ran at 0.5-0.8 or at 3.3-4.2 Gelem/s from one run to the next, and
# the table compared against its slow runs (docs/benchmarks.md, "Normalizations' outputs streamed").
#
# The table: the cases both sides have, by name; then the cases only evenflow has (no PyTorch twin),
# with "—" for PyTorch. A case that failed on one side (an exception, an unsupported op: each side
# prints "case<TAB>failed<TAB>reason" and goes on) is a row saying so, with the reason; a side that
# died leaves "—" in its column for the cases it did not reach, and a line after the table says how
# it ended. Exits 1 if any case failed or either side exited with an error, after the whole table.
#
# --self-test: the table of three rounds of made-up sides (stubs in place of bench_engine and of
# PyTorch's script), against the table it must print; exits 1 if they differ. The test command runs
# it: the GPU check's speed stage prints its tables through this script.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == --self-test ]]; then
  stub=$(mktemp -d)
  trap 'rm -rf "$stub"' EXIT
  mkdir "$stub/apps"
  # Ours: a product at 0.001, 0.002 and 0.003 s in rounds 1-3, a case failing in round 2, a case
  # PyTorch lacks. PyTorch's: the product at 0.002 s in every round, a case we lack.
  cat >"$stub/apps/bench_engine" <<'STUB'
#!/usr/bin/env bash
round=$(($(cat "$(dirname "$0")/../rounds" 2>/dev/null || echo 0) + 1))
echo "$round" >"$(dirname "$0")/../rounds"
printf 'matmul_a\t0.00%d\t%s\tGFLOP/s\n' "$round" "$(echo "100 50 33.33" | cut -d' ' -f"$round")"
if ((round == 2)); then printf 'flaky\tfailed\tout of memory\n'; else printf 'flaky\t0.1\t1.0\tGelem/s\n'; fi
printf 'ours_only\t0.5\t2.0\tus/op\n'
STUB
  cat >"$stub/python" <<'STUB'
#!/usr/bin/env bash
if [[ $1 == -c ]]; then echo stub; exit 0; fi
printf 'matmul_a\t0.002\t50.0\tGFLOP/s\nflaky\t0.2\t0.5\tGelem/s\ntheirs_only\t0.1\t1.0\tGelem/s\n'
STUB
  chmod +x "$stub/apps/bench_engine" "$stub/python"
  cat >"$stub/want" <<'WANT'
3 rounds, alternating; rates and the ratio are medians over them, the ratio's range after it
case                                           evenflow      pytorch time ratio (lowest-highest)
flaky                                        failed          0.50 Gelem        —  evenflow failed: out of memory
matmul_a                                      50.00 GFLOP   50.00 GFLOP     1.00 (0.50-1.50)
evenflow only (no PyTorch twin):
ours_only                                      2.00 us/op       —              —
pytorch only (no evenflow twin; a group whose setup failed on one side shows here):
theirs_only                                       —          1.00 Gelem        —
WANT
  rc=0
  ROUNDS=3 BUILD_DIR=$stub PYTHON=$stub/python bash "$0" cpu 1 >"$stub/got" || rc=$?
  if ((rc != 1)) || ! diff <(tail -n +2 "$stub/got") "$stub/want"; then
    echo "bench_engine.sh --self-test: the table above is not the one expected (exit status $rc, 1 expected)" >&2
    exit 1
  fi
  echo "bench_engine.sh --self-test: ok"
  exit 0
fi
kind=${1:-cpu}
threads=${2:-$(nproc)}
if [[ "$kind" == cpu ]]; then
  python=${PYTHON:-$(bash scripts/bench_python.sh)}
  ef_device=cpu:0; torch_device=cpu
  torch_env=(MALLOC_MMAP_THRESHOLD_=4294967296 MALLOC_TRIM_THRESHOLD_=4294967296)
else
  python=${PYTHON:-python3}
  ef_device=cuda:0; torch_device=cuda
  torch_env=()
fi
build=${BUILD_DIR:-build}
[[ -x "$build/apps/bench_engine" ]] || BUILD_DIR=$build TARGETS=bench_engine bash scripts/build.sh
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
common=(--threads "$threads" --min-seconds "${MIN_SECONDS:-1}" --tf32 "${TF32:-conv}" --precision "${PRECISION:-fp32}")
rounds=${ROUNDS:-1}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "bench_engine.sh: ROUNDS must be a positive whole number, got '$rounds'" >&2; exit 2; }
# Each side's error output is shown after it ends, and its last line names how a side that died ended
# (a round's; the rounds after a side died do not run it again).
ef_rc=0 torch_rc=0 failed_rows=0
for ((round = 1; round <= rounds; round++)); do
  if ((ef_rc == 0)); then
    OMP_NUM_THREADS=$threads "$build/apps/bench_engine" --device "$ef_device" "${common[@]}" \
      >"$scratch/ours.$round" 2>"$scratch/ours.err" || ef_rc=$?
    cat "$scratch/ours.err" >&2
  fi
  if ((torch_rc == 0)); then
    env "${torch_env[@]}" OMP_NUM_THREADS=$threads "$python" scripts/bench_torch.py --device "$torch_device" \
      "${common[@]}" >"$scratch/theirs.$round" 2>"$scratch/theirs.err" || torch_rc=$?
    cat "$scratch/theirs.err" >&2
  fi
done
torch_version=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '? (no torch)')
echo "device $kind, $threads threads, TF32 ${TF32:-conv} (on CUDA), precision ${PRECISION:-fp32}, $(date -u +%F), PyTorch $torch_version"
if ((rounds == 1)); then
  printf "%-42s %12s %12s %8s\n" case evenflow pytorch "time ratio"
else
  echo "$rounds rounds, alternating; rates and the ratio are medians over them, the ratio's range after it"
  printf "%-42s %12s %12s %8s %s\n" case evenflow pytorch "time ratio" "(lowest-highest)"
fi
# Rows as "section<TAB>key<TAB>text", sorted, the text printed: 1 both sides (by name), 2 evenflow
# only (in its order), 3 PyTorch only. A cell is "rate unit", "failed" or "—"; the numeric formats
# are the table's of before. A case that failed in any round is a failed row.
files=()
for ((round = 1; round <= rounds; round++)); do
  for side in ours theirs; do [[ -f "$scratch/$side.$round" ]] && files+=("$scratch/$side.$round"); done
done
LC_ALL=C awk -F'\t' -v rounds="$rounds" '
  function cell(width, rate, unit) { return sprintf("%" width ".2f %-5s", rate, substr(unit, 1, 5)) }
  function text(width, s) { return sprintf("%" width "s %-5s", s, "") }
  function dash(width) { return sprintf("%" (width - 1) "s%s %-5s", "", "—", "") }
  # The median of v[1..k] (sorted in place).
  function median(v, k,    i, j, x) {
    for (i = 2; i <= k; i++) { x = v[i]; for (j = i - 1; j >= 1 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
    return k % 2 ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2
  }
  # The median over the rounds of a side'"'"'s rate of `name`.
  function rate(side, name,    r, k, v) {
    k = 0
    for (r = 1; r <= rounds; r++) if ((side, name, r) in seconds) v[++k] = rates[side, name, r]
    return median(v, k)
  }
  # The row of `name`: each side'"'"'s median rate, and the median of the rounds'"'"' time ratios (rounds
  # where both sides ran it), with their range when there are several rounds.
  function row(name, in_ef, in_th,    e, t, r, k, v, lo, hi, ratio, why) {
    e = !in_ef ? dash(8) : (failed["ef", name] ? text(8, "failed") : cell(8, rate("ef", name), unit["ef", name]))
    t = !in_th ? dash(7) : (failed["th", name] ? text(7, "failed") : cell(7, rate("th", name), unit["th", name]))
    k = 0
    if (in_ef && in_th && !failed["ef", name] && !failed["th", name])
      for (r = 1; r <= rounds; r++)
        if (("ef", name, r) in seconds && ("th", name, r) in seconds) v[++k] = seconds["ef", name, r] / seconds["th", name, r]
    if (k == 0) ratio = sprintf("%7s%s", "", "—")
    else {
      lo = hi = v[1]
      for (r = 2; r <= k; r++) { if (v[r] < lo) lo = v[r]; if (v[r] > hi) hi = v[r] }
      ratio = sprintf("%8.2f", median(v, k)) (rounds > 1 ? sprintf(" (%.2f-%.2f)", lo, hi) : "")
    }
    why = ""
    if (in_ef && failed["ef", name]) why = why "  evenflow failed: " reason["ef", name]
    if (in_th && failed["th", name]) why = why "  pytorch failed: " reason["th", name]
    return sprintf("%-42s %s %s %s%s", name, e, t, ratio, why)
  }
  FNR == 1 { side = FILENAME ~ /\/ours\.[0-9]+$/ ? "ef" : "th"; round = FILENAME; sub(/.*\./, "", round) }
  NF < 3 { next }
  {
    if (!((side, $1) in seen)) { seen[side, $1] = 1; if (side == "ef") order[++n] = $1; else th_order[++m] = $1 }
    if ($2 == "failed") { failed[side, $1] = 1; reason[side, $1] = $3; failures++ }
    else { seconds[side, $1, round] = $2; rates[side, $1, round] = $3; unit[side, $1] = $4 }
  }
  END {
    for (i = 1; i <= n; i++) {
      name = order[i]
      if (("th", name) in seen) printf "1\t%s\t%s\n", name, row(name, 1, 1)
      else { printf "2\t%06d\t%s\n", i, row(name, 1, 0); only_ef++ }
    }
    for (i = 1; i <= m; i++) {
      name = th_order[i]
      if (!(("ef", name) in seen)) { printf "3\t%06d\t%s\n", i, row(name, 0, 1); only_th++ }
    }
    if (only_ef) printf "2\t\tevenflow only (no PyTorch twin):\n"
    if (only_th) printf "3\t\tpytorch only (no evenflow twin; a group whose setup failed on one side shows here):\n"
    exit (failures > 0)
  }' "${files[@]}" >"$scratch/rows" || failed_rows=1
LC_ALL=C sort -t $'\t' -k1,1n -k2,2 "$scratch/rows" | cut -f3-
# How a side that died ended: its exit status and its last line of error output.
ended() {  # ended SIDE STATUS ERRFILE
  local last
  last=$(grep -v '^\s*$' "$3" | tail -1 | cut -c1-300 || true)
  echo "$1 exited with status $2 after the rows above${last:+ (its last error line: $last)}"
}
((ef_rc == 0)) || ended "evenflow: bench_engine" "$ef_rc" "$scratch/ours.err"
((torch_rc == 0)) || ended "pytorch: bench_torch.py" "$torch_rc" "$scratch/theirs.err"
((ef_rc == 0 && torch_rc == 0 && failed_rows == 0))
