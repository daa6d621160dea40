#!/usr/bin/env bash
# On a machine with a GPU (the lent device machine): builds with CUDA, runs the whole test suite
# (the CUDA parity tests run there, on one physical GPU and on two logical devices sharing it, and
# the data-parallel tests on two logical devices), then the engine benchmark against PyTorch on the
# same GPU, the data-parallel memory-balance benchmark on four logical devices, and wgan_gp against
# PyTorch. One call does everything:
#   bash scripts/gpu_check.sh
# PyTorch's pip wheels bring cuDNN and NCCL; their lib/ folders go on LD_LIBRARY_PATH.
set -uo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
site=$("$python" -c 'import site; print(site.getsitepackages()[0])' 2>/dev/null || true)
for lib in "$site"/nvidia/*/lib; do [[ -d "$lib" ]] && export LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"; done
cudnn_root=$(ls -d "$site"/nvidia/cudnn 2>/dev/null || true)
extra=()
if [[ -n "$cudnn_root" && ! -f /usr/local/cuda/include/cudnn.h ]]; then
  extra+=(-DEF_CUDNN_INCLUDE="$cudnn_root/include" -DEF_CUDNN_LIB="$(ls "$cudnn_root"/lib/libcudnn.so* | head -1)")
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
BUILD_DIR=build-gpu bash scripts/build.sh -DEF_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 "${extra[@]}" || exit 1
status=0
echo "== tests, one logical device per GPU"
(cd build-gpu && ctest --output-on-failure --timeout 900 -j 4) || status=1
echo "== CUDA tests, two logical devices on GPU 0"
(cd build-gpu && EF_CUDA_DEVICES=0,0 ctest --output-on-failure --timeout 900 -R "cuda|CUDA") || status=1
echo "== benchmark: evenflow vs PyTorch on the GPU"
ours=$(mktemp); theirs=$(mktemp)
build-gpu/apps/bench_engine --device cuda:0 > "$ours" || status=1
"$python" scripts/bench_torch.py --device cuda > "$theirs" || status=1
printf "%-42s %12s %12s %8s\n" case evenflow pytorch "time ratio"
join -t $'\t' <(sort "$ours") <(sort "$theirs") |
  awk -F'\t' '{printf "%-42s %8.2f %-4s %7.2f %-4s %8.2f\n", $1, $3, substr($4,1,4), $6, substr($7,1,4), $2/$5}'
echo "== data parallel: memory balance and step time, four logical devices on GPU 0"
EF_CUDA_DEVICES=0,0,0,0 build-gpu/apps/bench_parallel --devices cuda || status=1
echo "== wgan_gp: images/s against the same model and step in PyTorch on the GPU"
PYTHON="$python" bash scripts/bench_wgan_gp.sh --build build-gpu --devices cuda:0 || status=1
exit $status
