#!/usr/bin/env bash
# Runs apps/bench_engine and the same cases in PyTorch, one after the other in this run, with the
# same thread count, and prints both rates and the ratio (evenflow time / PyTorch time; < 1 means
# evenflow is faster). Usage: scripts/bench_engine.sh [cpu|cuda] [threads]
# PYTHON=... picks PyTorch's interpreter; the default on CPU is PyTorch 2.15 from PyPI
# (scripts/bench_python.sh makes its venv), on CUDA the machine's python3. BUILD_DIR (default build),
# MIN_SECONDS (per case, default 1), TF32 (conv, the default of both, all or none: the same on
# both sides) and PRECISION (fp32, or bf16: the matmul and conv cases in bfloat16, PyTorch's under
# torch.autocast) from the environment.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-cpu}
threads=${2:-$(nproc)}
if [[ "$kind" == cpu ]]; then
  python=${PYTHON:-$(bash scripts/bench_python.sh)}
  ef_device=cpu:0; torch_device=cpu
else
  python=${PYTHON:-python3}
  ef_device=cuda:0; torch_device=cuda
fi
build=${BUILD_DIR:-build}
[[ -x "$build/apps/bench_engine" ]] || BUILD_DIR=$build TARGETS=bench_engine bash scripts/build.sh
ours=$(mktemp); theirs=$(mktemp)
common=(--threads "$threads" --min-seconds "${MIN_SECONDS:-1}" --tf32 "${TF32:-conv}" --precision "${PRECISION:-fp32}")
OMP_NUM_THREADS=$threads "$build/apps/bench_engine" --device "$ef_device" "${common[@]}" > "$ours"
OMP_NUM_THREADS=$threads "$python" scripts/bench_torch.py --device "$torch_device" "${common[@]}" > "$theirs"
echo "device $kind, $threads threads, TF32 ${TF32:-conv} (on CUDA), precision ${PRECISION:-fp32}, $(date -u +%F), PyTorch $("$python" -c 'import torch; print(torch.__version__)')"
printf "%-42s %12s %12s %8s\n" case evenflow pytorch "time ratio"
join -t $'\t' <(sort "$ours") <(sort "$theirs") | sort -t $'\t' -k1,1 |
  awk -F'\t' '{printf "%-42s %8.2f %-5s %7.2f %-5s %8.2f\n", $1, $3, substr($4,1,5), $6, substr($7,1,5), $2/$5}'
rm -f "$ours" "$theirs"
