#!/usr/bin/python3
"""The PyTorch side of apps/tools/classify_steps: the same network without dropout, loaded from the
initial weights classify_steps wrote, trained with Adam 1e-3 on the first training images in order,
one thread, printing each step's loss. Needs torch, numpy and safetensors (pip install safetensors;
put it on PYTHONPATH)."""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from safetensors.torch import load_file

from fashion_idx import read_idx  # scripts/fashion_idx.py


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--init", default="classify_init.safetensors")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    a = p.parse_args()
    torch.set_num_threads(1)
    x = torch.from_numpy(read_idx(a.data, "train-images-idx3-ubyte").astype(np.float32) / 255.0).unsqueeze(1)
    y = torch.from_numpy(read_idx(a.data, "train-labels-idx1-ubyte").astype(np.int64))
    net = nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                        nn.Linear(3136, 1024), nn.ReLU(), nn.Dropout(0.0), nn.Linear(1024, 10))
    net.load_state_dict(load_file(a.init), strict=True)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    for step in range(a.steps):
        b = slice(step * a.batch_size, (step + 1) * a.batch_size)
        loss = F.cross_entropy(net(x[b]), y[b])
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(step, f"{loss.item():.9g}")


if __name__ == "__main__":
    main()
