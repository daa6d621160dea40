#!/usr/bin/env bash
# Where a WGAN-GP generator step's GPU time goes, kernel by kernel, evenflow's against PyTorch's: each
# side's eager step (scripts/bench_wgan_gp.sh's settings: 5 critic steps, batch 64, Adam, cuDNN's timed
# choice, TF32 convolutions) run under Nsight Compute twice, for --short and --long generator steps;
# scripts/ncu_kernels.py takes the difference, so that start-up, cuDNN's search and the last sample
# cancel, and prints each kernel's time and launches a step, most time first, with the step's total.
# Each kernel is timed alone (ncu serializes them; `gpu__time_duration`, clocks left alone as the
# device notes ask), so the total is the GPU's work a step without the host's gaps: set beside the
# step's time from bench_wgan_gp.sh, it says how launch-bound the step is, and the tables say which
# kernels bfloat16 makes slower or adds (docs/gpu.md, "Where a step's GPU time goes").
#   bash scripts/profile_wgan_gp.sh [--build DIR] [--model resnet|dcgan] [--precision fp32|bf16]...
#                                   [--data DIR] [--short N] [--long N] [--top K] [--out DIR]
# --precision may be given more than once (default: fp32 and bf16); bf16 is the app's --precision bf16
# against torch.autocast(bfloat16). --out keeps ncu's CSVs (default: a temporary folder). Needs a CUDA
# device, ncu (Nsight Compute; it cannot read the GPU under gVisor) and PyTorch (PYTHON, default
# python3). Exits 1 when a run fails; the other runs are still made.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

build=build model=resnet data=/usr/share/datasets/fashion-mnist short=1 long=3 top=25 out='' precisions=()
python=${PYTHON:-python3}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --precision) precisions+=("$2"); shift 2 ;;
    --data) data=$2; shift 2 ;;
    --short) short=$2; shift 2 ;;
    --long) long=$2; shift 2 ;;
    --top) top=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "profile_wgan_gp.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
((${#precisions[@]})) || precisions=(fp32 bf16)
if ! [[ "$short" =~ ^[1-9][0-9]*$ && "$long" =~ ^[1-9][0-9]*$ ]] || ((long <= short)); then
  echo "profile_wgan_gp.sh: --short and --long must be positive integers, --long the larger" >&2
  exit 2
fi
[[ -x "$build/apps/wgan_gp" ]] || { echo "profile_wgan_gp.sh: $build/apps/wgan_gp not built (--build DIR)" >&2; exit 2; }
command -v ncu >/dev/null || { echo "profile_wgan_gp.sh: ncu (Nsight Compute) is not on the PATH" >&2; exit 2; }
case "$model" in
  resnet) model_args=(--model resnet) norm=none ;;
  dcgan) model_args=(--model dcgan --data "$data") norm=layernorm ;;
  *) echo "profile_wgan_gp.sh: --model must be resnet or dcgan, got $model" >&2; exit 2 ;;
esac
for p in "${precisions[@]}"; do
  [[ "$p" == fp32 || "$p" == bf16 ]] || { echo "profile_wgan_gp.sh: --precision must be fp32 or bf16, got $p" >&2; exit 2; }
done
if [[ -z "$out" ]]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"

common=(--batch-size 64 --critic-steps 5 --lr 1e-4 --seed 0 --norm "$norm" "${model_args[@]}")
ncu_args=(ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base
  --print-kernel-base demangled)
status=0
# profiled SIDE PRECISION STEPS: ncu's CSV of one run, at $out/SIDE-PRECISION-STEPS.csv.
profiled() {
  local side=$1 precision=$2 steps=$3 csv=$out/$1-$2-$3.csv
  local cmd
  if [[ $side == evenflow ]]; then
    cmd=("$build/apps/wgan_gp" --steps "$steps" --devices cuda:0 --cudnn-benchmark "${common[@]}"
      --sample-every 1000000000 --fid-every 1000000000 --final-fid-samples 0 --out "$out/ef-run" --overwrite)
    [[ $precision == bf16 ]] && cmd+=(--precision bf16)
  else
    cmd=("$python" scripts/wgan_gp_torch.py --steps "$steps" --warmup 0 --device cuda:0 "${common[@]}"
      --autocast "$([[ $precision == bf16 ]] && echo bf16 || echo none)")
  fi
  "${ncu_args[@]}" --log-file "$csv" "${cmd[@]}" >"$out/$side-$precision-$steps.out" 2>&1 ||
    { echo "profile_wgan_gp.sh: $side $precision --steps $steps failed; its output:" >&2
      tail -20 "$out/$side-$precision-$steps.out" >&2; tail -5 "$csv" >&2; return 1; }
}
for precision in "${precisions[@]}"; do
  for side in evenflow pytorch; do
    echo "== $side, $model, $precision: each kernel a generator step ($((long - short)) steps: --steps $long less --steps $short)"
    if profiled "$side" "$precision" "$short" && profiled "$side" "$precision" "$long"; then
      "$python" scripts/ncu_kernels.py "$out/$side-$precision-$short.csv" "$out/$side-$precision-$long.csv" \
        --steps $((long - short)) --label "$side $model $precision" --top "$top" || status=1
    else
      status=1
    fi
  done
done
exit $status
