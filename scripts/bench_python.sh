#!/usr/bin/env bash
# Prints the Python interpreter of the benchmarks' baseline: PyTorch 2.15.0 from PyPI (MKL + oneDNN
# on CPU, what a user would pick), in a virtual environment made here on first use. Debian's
# python3-torch 1.13 computes GEMM with the reference BLAS, so it serves fixtures only.
#   python=$(bash scripts/bench_python.sh)     EF_BENCH_VENV=DIR picks the folder.
set -euo pipefail
venv=${EF_BENCH_VENV:-$HOME/.cache/evenflow/torch-2.15.0}
version=2.15.0
if ! "$venv/bin/python" -c "import sys, numpy, safetensors, torch; sys.exit(torch.__version__.split('+')[0] != '$version')" 2>/dev/null; then
  echo "bench_python: installing torch==$version, numpy and safetensors into $venv (about 3 GB, once)" >&2
  if ! python3 -c "import ensurepip" 2>/dev/null; then
    sudo_cmd=()
    if [[ $(id -u) -ne 0 ]]; then sudo_cmd=(sudo); fi
    "${sudo_cmd[@]}" apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends python3-venv >&2
  fi
  python3 -m venv "$venv" >&2
  "$venv/bin/pip" install -q "torch==$version" numpy safetensors >&2
fi
echo "$venv/bin/python"
