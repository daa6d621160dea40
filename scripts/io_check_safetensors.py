#!/usr/bin/env python3
"""Cross-checks evenflow's safetensors files with the reference implementation (safetensors.torch).

Both sides build the same tensors from one recipe (expected() below; tests/io/test_safetensors.cpp
has its twin, cross_check_tensors()):

  io_check_safetensors.py check OURS THEIRS   loads OURS, written by evenflow, with
                                              safetensors.torch.load_file, compares it with the
                                              recipe, then writes THEIRS for evenflow to load
  io_check_safetensors.py fixture OUT         only writes OUT (regenerates the committed
                                              tests/fixtures/io/torch_written.safetensors)

Needs PyTorch (Debian: python3-torch, run with /usr/bin/python3) and safetensors, e.g.
`pip install --target /tmp/st safetensors` and PYTHONPATH=/tmp/st. Exits non-zero on a mismatch.
"""
import sys

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def expected():
    return {
        "f32": torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) * 0.25 - 3,
        "f64": torch.tensor([[1.0 / 3.0, -2.5e-300], [1e300, -0.0]], dtype=torch.float64),
        "i64": torch.tensor([-(2**63), -1, 0, 2**63 - 1], dtype=torch.int64),
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.zeros(0, 3, dtype=torch.float32),
        # Values bfloat16 holds exactly (8 significant bits), so no rounding is compared.
        "bf16": torch.tensor([1.0, -2.5, 3.140625, -0.0, 2.0**100, 65280.0], dtype=torch.bfloat16),
        "transposed": torch.arange(6, dtype=torch.float32).reshape(2, 3).t().contiguous(),
    }


def check(ours, theirs):
    want = expected()
    got = load_file(ours)
    errors = []
    if sorted(got) != sorted(want):
        errors.append(f"keys {sorted(got)}, expected {sorted(want)}")
    for name, w in want.items():
        g = got.get(name)
        if g is None:
            continue
        if g.dtype != w.dtype or g.shape != w.shape or not torch.equal(g, w):
            errors.append(f"{name}: got {g.dtype} {tuple(g.shape)} {g.flatten()[:8].tolist()}, "
                          f"expected {w.dtype} {tuple(w.shape)} {w.flatten()[:8].tolist()}")
        # -0.0 == 0.0 in torch.equal: compare the sign bits too.
        if w.is_floating_point() and not torch.equal(torch.signbit(g), torch.signbit(w)):
            errors.append(f"{name}: signs of zeros differ")
    with safe_open(ours, framework="pt") as f:
        metadata = f.metadata()
    if metadata != {"written_by": "evenflow", "format": "pt"}:
        errors.append(f"metadata {metadata}")
    if errors:
        print("io_check_safetensors: " + ours + " does not match the recipe:\n  " + "\n  ".join(errors))
        sys.exit(1)
    write(theirs)
    print(f"io_check_safetensors: {ours} matches ({len(want)} tensors, metadata); wrote {theirs}")


def write(path):
    save_file(expected(), path, metadata={"written_by": "torch", "format": "pt"})


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "check":
        check(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "fixture":
        write(sys.argv[2])
    else:
        sys.exit(__doc__)
