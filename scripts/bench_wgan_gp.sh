#!/usr/bin/env bash
# Benchmark: apps/wgan_gp against its PyTorch twin (scripts/wgan_gp_torch.py): the same generator, critic,
# WGAN-GP step (critic steps with a double-backward penalty, then a generator step), batch, Adam, norm, seed
# and threads. Prints the images/s of each (real images consumed by the critic steps) and the ratio
# evenflow / PyTorch (> 1: evenflow is faster).
#   scripts/bench_wgan_gp.sh [--steps N] [--warmup W] [--devices cuda:0] [--threads T] [--norm layernorm]
#                            [--batch-size B] [--seed S] [--precision fp32|bf16|bf16-results] [--rounds R] [--build DIR]
#                            [--data DIR] [--model dcgan|resnet] [--cuda-graph]
# --model dcgan (default): the small DCGAN-like networks on FashionMNIST (--data). --model resnet: the
# WGAN-GP paper's CIFAR-10 ResNet (width 128, 32x32x3 images) on synthetic images, no data set (--data is
# not passed); its critic has no normalization, so both sides run with --norm none (another --norm is an
# error).
# --precision bf16 runs the app with --precision bf16 and PyTorch under torch.autocast(bfloat16)
# (wgan_gp_torch.py --autocast bf16): the mixed precision each offers, compared like with like.
# --precision bf16-results (CUDA devices): the app also with --cudnn-bf16-results, its convolutions then
# free to round their results to bfloat16 where cuDNN's kernels for that are faster -- what autocast's
# convolutions give.
# --cuda-graph passes --cuda-graph to both: each captures its whole generator step (all critic steps with
# their penalties and Adam steps, then the generator step) once after the warm-up and replays it (PyTorch:
# one torch.cuda.CUDAGraph, capturable Adam). When PyTorch cannot capture or replay it, wgan_gp_torch.py
# exits with status 3 and a line "cuda_graph_error: <type>: <message>"; the bench then prints evenflow's
# figures and "pytorch    cannot capture: <that line>" in place of PyTorch's figures and the ratio.
#   PYTHON=python3 scripts/bench_wgan_gp.sh ...   (PyTorch's interpreter; default: PyTorch 2.15 from PyPI
#   made by scripts/bench_python.sh for CPU devices, python3 for CUDA ones)
# Both run W warm-up generator steps (default 5) and then N timed ones (default 50). The app times every
# step (no warm-up of its own) and writes cumulative seconds per step to metrics.csv, so its rate is
# taken between the row of step W and the last row: N * batch * critic_steps / (seconds_last - seconds_W).
# Sampling and the Frechet distance are kept out of the run (--sample-every/--fid-every past the end);
# what the app does after its last step (a last sample, and a Frechet distance when
# runs/classify/model.safetensors exists) is not timed.
# --rounds R runs evenflow and PyTorch R times, taking turns, prints each round, and reports each side's
# median: on a shared VM one side's rate can move by 30% from one minute to the next (docs/benchmarks.md,
# "On an AMD Zen 4"), so a single round can tell the wrong story.
# PyTorch runs on one device, the first --devices names (cuda:0,1 -> cuda:0; cpu:N -> cpu); with
# several devices the ratio is evenflow data-parallel against PyTorch's single-device step.
set -euo pipefail
cd "$(dirname "$0")/.."

steps=50 warmup=5 devices=cuda:0 threads=$(nproc) norm='' batch=64 seed=0 build=build precision=fp32 rounds=1
data=/usr/share/datasets/fashion-mnist model=dcgan cuda_graph=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --devices) devices=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --norm) norm=$2; shift 2 ;;
    --batch-size) batch=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --precision) precision=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --data) data=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --cuda-graph) cuda_graph=1; shift ;;
    *) echo "bench_wgan_gp.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[[ -x "$build/apps/wgan_gp" ]] || { echo "bench_wgan_gp.sh: $build/apps/wgan_gp not built (--build DIR)" >&2; exit 2; }
[[ "$steps" =~ ^[1-9][0-9]*$ ]] || { echo "bench_wgan_gp.sh: --steps must be a positive integer, got $steps" >&2; exit 2; }
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "bench_wgan_gp.sh: --rounds must be a positive integer, got $rounds" >&2; exit 2; }
[[ "$warmup" =~ ^[0-9]+$ ]] || { echo "bench_wgan_gp.sh: --warmup must be a non-negative integer, got $warmup" >&2; exit 2; }
# What both programs are given for the model: its networks, norm and data.
case "$model" in
  dcgan) norm=${norm:-layernorm} model_args=(--model dcgan --data "$data") ;;
  resnet)
    [[ -z "$norm" || "$norm" == none ]] ||
      { echo "bench_wgan_gp.sh: --model resnet has no critic normalization: --norm must be none, got $norm" >&2; exit 2; }
    norm=none model_args=(--model resnet) ;;
  *) echo "bench_wgan_gp.sh: --model must be dcgan or resnet, got $model" >&2; exit 2 ;;
esac
graph_args=()
if ((cuda_graph)); then
  [[ "$devices" != cpu* ]] || { echo "bench_wgan_gp.sh: --cuda-graph needs CUDA --devices, got $devices" >&2; exit 2; }
  ((warmup > 0)) || { echo "bench_wgan_gp.sh: --cuda-graph needs --warmup 1 or more (the capture follows warm-up steps)" >&2; exit 2; }
  graph_args=(--cuda-graph)
fi
case "$precision" in
  fp32) autocast=none app_precision=(--precision fp32) ;;
  bf16) autocast=bf16 app_precision=(--precision bf16) ;;
  bf16-results)
    [[ "$devices" == cuda* ]] ||
      { echo "bench_wgan_gp.sh: --precision bf16-results needs CUDA --devices, got $devices" >&2; exit 2; }
    autocast=bf16 app_precision=(--precision bf16 --cudnn-bf16-results) ;;
  *) echo "bench_wgan_gp.sh: --precision must be fp32, bf16 or bf16-results, got $precision" >&2; exit 2 ;;
esac
case "$devices" in
  cpu*) python=${PYTHON:-$(bash scripts/bench_python.sh)} ;;
  *) python=${PYTHON:-python3} ;;
esac
case "$devices" in
  auto) torch_device=$("$python" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")') ;;
  cpu*) torch_device=cpu ;;
  cuda:*) torch_device=${devices%%,*} ;;
  *) torch_device=$devices ;;
esac
critic_steps=5  # the WGAN-GP paper's, which the speed figures in docs/benchmarks.md use
lr=1e-4         # the paper's, as wgan_gp_torch.py's (wgan_gp's default is 2e-4; the work is the same)
total=$((warmup + steps))

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# cuDNN's timed algorithm choice on both sides: wgan_gp_torch.py turns cudnn.benchmark on.
cudnn=()
[[ "$devices" == cuda* ]] && cudnn=(--cudnn-benchmark)

# One round: evenflow, then PyTorch. Prints "evenflow_images_per_s evenflow_s_per_step pytorch_images_per_s
# pytorch_s_per_step", PyTorch's two figures "-" when it could not capture the step (--cuda-graph; its
# cuda_graph_error line is then in $out/torch_error.txt).
one_round() {
  echo "== evenflow wgan_gp: $warmup warm-up + $steps timed generator steps, $devices, $threads thread(s), model $model," \
    "norm $norm, batch $batch, precision $precision${graph_args[*]:+, CUDA graph}" >&2
  rm -rf "$out/ef"
  "$build/apps/wgan_gp" --steps "$total" --devices "$devices" --threads "$threads" "${model_args[@]}" --norm "$norm" \
    "${app_precision[@]}" "${cudnn[@]}" "${graph_args[@]}" --batch-size "$batch" --critic-steps "$critic_steps" --lr "$lr" \
    --seed "$seed" --sample-every 1000000000 --fid-every 1000000000 --final-fid-samples 0 --out "$out/ef" >&2
  echo "== PyTorch $("$python" -c 'import torch; print(torch.__version__)') on $torch_device" >&2
  local status=0
  "$python" scripts/wgan_gp_torch.py --steps "$steps" --warmup "$warmup" --device "$torch_device" --threads "$threads" \
    "${model_args[@]}" --norm "$norm" "${graph_args[@]}" --batch-size "$batch" --critic-steps "$critic_steps" --lr "$lr" \
    --seed "$seed" --autocast "$autocast" | tee "$out/torch.txt" >&2 || status=$?
  # metrics.csv: step,critic_loss,generator_loss,wasserstein,frechet,frechet_floor,seconds,images_per_s
  # (cumulative seconds; the columns are found by name).
  local ef th
  ef=$(awk -F, -v warmup="$warmup" -v steps="$steps" -v images="$((batch * critic_steps))" '
    NR == 1 { for (i = 1; i <= NF; ++i) col[$i] = i; next }
    $col["step"] == warmup { start = $col["seconds"] }
    { last = $col["seconds"]; last_step = $col["step"] }
    END {
      if (last_step != warmup + steps) { print "metrics.csv ends at step " last_step > "/dev/stderr"; exit 1 }
      s = last - start
      printf "%.1f %.6f\n", steps * images / s, s / steps
    }' "$out/ef/metrics.csv")
  th=$(awk '$1 == "images_per_s" { print $2, $4 }' "$out/torch.txt" | tail -n 1)
  if ((status == 3)) && grep -q '^cuda_graph_error:' "$out/torch.txt"; then
    grep -m 1 '^cuda_graph_error:' "$out/torch.txt" >"$out/torch_error.txt"
    th='- -'
  elif ((status != 0)); then
    echo "bench_wgan_gp.sh: wgan_gp_torch.py failed (exit status $status)" >&2; exit 1
  fi
  [[ -n "$th" ]] || { echo "bench_wgan_gp.sh: no images_per_s line from wgan_gp_torch.py" >&2; exit 1; }
  echo "$ef $th"
}

for ((r = 1; r <= rounds; ++r)); do one_round >>"$out/rounds.txt"; done
case "$devices" in
  cpu | cpu:1 | cuda:[0-9] | cuda:[0-9][0-9]) ;;
  *) echo "note: evenflow ran on $devices (maybe several devices), PyTorch on one ($torch_device)" >&2 ;;
esac
echo
if ((rounds > 1)); then
  awk '$3 == "-" { printf "round %-4d evenflow %8.1f images/s  pytorch cannot capture\n", NR, $1; next }
       { printf "round %-4d evenflow %8.1f images/s  pytorch %8.1f images/s  ratio %.2f\n", NR, $1, $3, $1 / $3 }' "$out/rounds.txt"
fi
# The median of the rounds, each side on its own (one round: its figures). When PyTorch could not capture
# the step (in any round: a capture fails alike in every round), its error replaces its figures and the ratio.
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }'; }
ef_ips=$(awk '{ print $1 }' "$out/rounds.txt" | median)
ef_sps=$(awk '{ print $2 }' "$out/rounds.txt" | median)
printf '%-10s %12s %12s\n' "" "images/s" "s/step"
printf '%-10s %12.1f %12.4f\n' evenflow "$ef_ips" "$ef_sps"
if [[ -s "$out/torch_error.txt" ]]; then
  printf '%-10s cannot capture: %s\n' pytorch "$(cat "$out/torch_error.txt")"
else
  th_ips=$(awk '{ print $3 }' "$out/rounds.txt" | median)
  th_sps=$(awk '{ print $4 }' "$out/rounds.txt" | median)
  printf '%-10s %12.1f %12.4f\n' pytorch "$th_ips" "$th_sps"
  awk -v a="$ef_ips" -v b="$th_ips" 'BEGIN { printf "%-10s %12.2f   (evenflow / pytorch, > 1: evenflow faster)\n", "ratio", a / b }'
fi
