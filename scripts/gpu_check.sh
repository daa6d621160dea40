#!/usr/bin/env bash
# On a machine with a GPU (the lent device machine), in one call:
#   bash scripts/gpu_check.sh
# checks the driver first and says what it found, builds with CUDA, runs the whole test suite with
# two logical devices on GPU 0 (EF_CUDA_DEVICES=0,0) and EF_REQUIRE_CUDA=1, so that a CUDA test that
# would skip fails instead; then compute-sanitizer (memcheck, racecheck) over the small CUDA tests,
# the engine benchmark against PyTorch on the same GPU, the data-parallel memory-balance benchmark on
# four logical devices, and wgan_gp against PyTorch. Exits non-zero if anything failed.
#
# cuDNN and NCCL: from the CUDA toolkit when it has them, else from PyTorch's pip wheels -- only those
# two folders go on LD_LIBRARY_PATH, and only wheels built for the toolkit's CUDA major version
# (every nvidia/*/lib folder would also bring cuBLAS and the runtime of whatever CUDA PyTorch uses).
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}

echo "== GPU, driver and toolkit"
if ! nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; then
  echo "gpu_check: nvidia-smi failed: no GPU or no working driver here" >&2
  exit 1
fi
driver_cuda=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' | head -1)
toolkit_cuda=$(nvcc --version | sed -n 's/.*release \([0-9][0-9.]*\),.*/\1/p')
echo "driver supports CUDA ${driver_cuda:-?}; nvcc is CUDA ${toolkit_cuda:-?}"
major=${toolkit_cuda%%.*}
if [[ -z "$major" || -z "$driver_cuda" ]]; then
  echo "gpu_check: could not read the CUDA versions of nvcc and the driver" >&2
  exit 1
fi
if ((${driver_cuda%%.*} < major)); then
  echo "gpu_check: the driver supports CUDA $driver_cuda, older than the toolkit's $toolkit_cuda" >&2
  exit 1
fi

# The folder (include/ and lib/ side by side) of a wheel's library, checked against the CUDA major.
site=$("$python" -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)
wheel_root() {  # wheel_root <pip name prefix, e.g. nvidia-cudnn-cu> <header>
  local dist
  dist=$("$python" -m pip list 2>/dev/null | awk -v p="$1" 'index(tolower($1), p) == 1 {print $1}' | head -1)
  [[ -n "$dist" ]] || return 1
  if [[ "${dist##*-cu}" != "$major" ]]; then
    echo "gpu_check: $dist is for CUDA ${dist##*-cu}, the toolkit is CUDA $major: not using it" >&2
    return 1
  fi
  local header
  header=$(find "$site/nvidia" -name "$2" -path '*/include/*' 2>/dev/null | head -1)
  [[ -n "$header" ]] && dirname "$(dirname "$header")"
}
extra=()
if [[ ! -f /usr/local/cuda/include/cudnn.h ]]; then
  if cudnn_root=$(wheel_root nvidia-cudnn-cu cudnn.h); then
    echo "cuDNN from $cudnn_root"
    extra+=(-DEF_CUDNN_INCLUDE="$cudnn_root/include" -DEF_CUDNN_LIB="$(ls "$cudnn_root"/lib/libcudnn.so* | head -1)")
    export LD_LIBRARY_PATH="$cudnn_root/lib:${LD_LIBRARY_PATH:-}"
  fi
fi
if [[ ! -f /usr/local/cuda/include/nccl.h ]]; then
  if nccl_root=$(wheel_root nvidia-nccl-cu nccl.h); then
    echo "NCCL from $nccl_root"
    extra+=(-DEF_NCCL_ROOT="$nccl_root")
    export LD_LIBRARY_PATH="$nccl_root/lib:${LD_LIBRARY_PATH:-}"
  fi
fi

BUILD_DIR=build-gpu bash scripts/build.sh -DEF_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 "${extra[@]}" || exit 1
status=0
export EF_REQUIRE_CUDA=1
echo "== tests, two logical devices on GPU 0, CUDA skips are failures"
(cd build-gpu && EF_CUDA_DEVICES=0,0 ctest --output-on-failure --timeout 900 -j 4) || status=1

echo "== compute-sanitizer (memcheck, racecheck) over the small CUDA tests"
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    EF_CUDA_DEVICES=0,0 compute-sanitizer --tool "$tool" --error-exitcode 1 build-gpu/tests/test_engine \
      -tc="cuda parity: every op? float64,cuda parity: the multi-tensor Adam step,cuda: copies*,cuda: a host-to-device*,cuda: a bad index*" \
      || status=1
    EF_CUDA_DEVICES=0,0 compute-sanitizer --tool "$tool" --error-exitcode 1 build-gpu/tests/test_parallel \
      -tc="*CUDA*" || status=1
  done
else
  echo "gpu_check: compute-sanitizer not found" >&2
  status=1
fi

echo "== benchmark: evenflow vs PyTorch on the GPU"
ours=$(mktemp)
theirs=$(mktemp)
build-gpu/apps/bench_engine --device cuda:0 >"$ours" || status=1
"$python" scripts/bench_torch.py --device cuda >"$theirs" || status=1
printf "%-42s %12s %12s %8s\n" case evenflow pytorch "time ratio"
join -t $'\t' <(sort "$ours") <(sort "$theirs") |
  awk -F'\t' '{printf "%-42s %8.2f %-4s %7.2f %-4s %8.2f\n", $1, $3, substr($4,1,4), $6, substr($7,1,4), $2/$5}'
echo "== data parallel: memory balance and step time, four logical devices on GPU 0"
EF_CUDA_DEVICES=0,0,0,0 build-gpu/apps/bench_parallel --devices cuda || status=1
echo "== wgan_gp: images/s against the same model and step in PyTorch on the GPU"
PYTHON="$python" bash scripts/bench_wgan_gp.sh --build build-gpu --devices cuda:0 || status=1
echo "gpu_check: $([[ $status == 0 ]] && echo passed || echo FAILED)"
exit $status
