"""The TF32 setting of the PyTorch baselines, named as evenflow's benchmarks name theirs, so that both sides
of a GPU comparison compute float32 the same way (Note [CUDA math settings] in engine/device.h):
  conv  TF32 in cuDNN convolutions, full float32 in matrix products: PyTorch's default and evenflow's
  all   TF32 in both
  none  full float32 in both
"""
import warnings

import torch

CHOICES = ("conv", "all", "none")


def set_tf32(mode):
    """Applies `mode` (one of CHOICES) and returns a line saying what PyTorch now does."""
    conv, matmul = mode in ("conv", "all"), mode == "all"
    with warnings.catch_warnings():  # newer PyTorch prefers its fp32_precision settings; these still apply
        warnings.simplefilter("ignore")
        torch.backends.cudnn.allow_tf32 = conv
        torch.backends.cuda.matmul.allow_tf32 = matmul
        conv, matmul = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    return f"TF32: convolutions {'on' if conv else 'off'}, matrix products {'on' if matmul else 'off'}"
