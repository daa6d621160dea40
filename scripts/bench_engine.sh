#!/usr/bin/env bash
# Runs apps/bench_engine and the same cases in PyTorch, one after the other in this run, with the
# same thread count, and prints both rates and the ratio (evenflow time / PyTorch time; < 1 means
# evenflow is faster). Usage: scripts/bench_engine.sh [cpu|cuda] [threads]
# PYTHON=... picks PyTorch's interpreter; the default on CPU is PyTorch 2.15 from PyPI
# (scripts/bench_python.sh makes its venv), on CUDA the machine's python3. BUILD_DIR (default build),
# MIN_SECONDS (per case, default 1), TF32 (conv, the default of both, all or none: the same on
# both sides) and PRECISION (fp32, or bf16: the matmul and conv cases in bfloat16, PyTorch's under
# torch.autocast) from the environment.
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
set -euo pipefail
cd "$(dirname "$0")/.."
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
# Each side's error output is shown after it ends, and its last line names how a side that died ended.
ef_rc=0 torch_rc=0 failed_rows=0
OMP_NUM_THREADS=$threads "$build/apps/bench_engine" --device "$ef_device" "${common[@]}" \
  >"$scratch/ours" 2>"$scratch/ours.err" || ef_rc=$?
cat "$scratch/ours.err" >&2
env "${torch_env[@]}" OMP_NUM_THREADS=$threads "$python" scripts/bench_torch.py --device "$torch_device" "${common[@]}" \
  >"$scratch/theirs" 2>"$scratch/theirs.err" || torch_rc=$?
cat "$scratch/theirs.err" >&2
torch_version=$("$python" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo '? (no torch)')
echo "device $kind, $threads threads, TF32 ${TF32:-conv} (on CUDA), precision ${PRECISION:-fp32}, $(date -u +%F), PyTorch $torch_version"
printf "%-42s %12s %12s %8s\n" case evenflow pytorch "time ratio"
# Rows as "section<TAB>key<TAB>text", sorted, the text printed: 1 both sides (by name), 2 evenflow
# only (in its order), 3 PyTorch only. A cell is "rate unit", "failed" or "—"; the numeric formats
# are the table's of before.
LC_ALL=C awk -F'\t' '
  function cell(width, rate, unit) { return sprintf("%" width ".2f %-5s", rate, substr(unit, 1, 5)) }
  function text(width, s) { return sprintf("%" width "s %-5s", s, "") }
  function dash(width) { return sprintf("%" (width - 1) "s%s %-5s", "", "—", "") }
  function row(name, in_ef, in_th,    e, t, ok, r, why) {
    e = !in_ef ? dash(8) : (ef_failed[name] ? text(8, "failed") : cell(8, ef_rate[name], ef_unit[name]))
    t = !in_th ? dash(7) : (th_failed[name] ? text(7, "failed") : cell(7, th_rate[name], th_unit[name]))
    ok = in_ef && in_th && !ef_failed[name] && !th_failed[name]
    r = ok ? sprintf("%8.2f", ef_seconds[name] / th_seconds[name]) : sprintf("%7s%s", "", "—")
    why = ""
    if (in_ef && ef_failed[name]) why = why "  evenflow failed: " ef_why[name]
    if (in_th && th_failed[name]) why = why "  pytorch failed: " th_why[name]
    return sprintf("%-42s %s %s %s%s", name, e, t, r, why)
  }
  FNR == 1 { side++ }
  NF < 3 { next }
  side == 1 {
    if (!($1 in ef_seen)) order[++n] = $1
    ef_seen[$1] = 1
    if ($2 == "failed") { ef_failed[$1] = 1; ef_why[$1] = $3; failures++ }
    else { ef_failed[$1] = 0; ef_seconds[$1] = $2; ef_rate[$1] = $3; ef_unit[$1] = $4 }
  }
  side == 2 {
    if (!($1 in th_seen)) th_order[++m] = $1
    th_seen[$1] = 1
    if ($2 == "failed") { th_failed[$1] = 1; th_why[$1] = $3; failures++ }
    else { th_failed[$1] = 0; th_seconds[$1] = $2; th_rate[$1] = $3; th_unit[$1] = $4 }
  }
  END {
    for (i = 1; i <= n; i++) {
      name = order[i]
      if (name in th_seen) printf "1\t%s\t%s\n", name, row(name, 1, 1)
      else { printf "2\t%06d\t%s\n", i, row(name, 1, 0); only_ef++ }
    }
    for (i = 1; i <= m; i++) {
      name = th_order[i]
      if (!(name in ef_seen)) { printf "3\t%06d\t%s\n", i, row(name, 0, 1); only_th++ }
    }
    if (only_ef) printf "2\t\tevenflow only (no PyTorch twin):\n"
    if (only_th) printf "3\t\tpytorch only (no evenflow twin; a group whose setup failed on one side shows here):\n"
    exit (failures > 0)
  }' "$scratch/ours" "$scratch/theirs" >"$scratch/rows" || failed_rows=1
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
