#!/usr/bin/python3
"""The PyTorch twin of apps/classify, for scripts/bench_classify.sh: the same CNN
(Conv2d(1,32,5,p2)-ReLU-MaxPool(2)-Conv2d(32,64,5,p2)-ReLU-MaxPool(2)-Flatten-Linear(3136,1024)-ReLU-
Dropout(0.4)-Linear(1024,10)), Adam, batch size and thread count, reading the same FashionMNIST IDX
files (gzip or raw). Prints one line per epoch:
    epoch <e> seconds <training seconds> images_per_s <x> test_accuracy <fraction>
Runs with Debian's python3-torch (1.13); needs only torch and numpy. On a GPU, TF32 in convolutions
only (--tf32 conv, PyTorch's default and evenflow's)."""
import argparse
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from fashion_idx import read_idx  # scripts/fashion_idx.py
from torch_tf32 import CHOICES, set_tf32  # scripts/torch_tf32.py


def load(root, split):
    images = read_idx(root, f"{split}-images-idx3-ubyte").astype(np.float32) / 255.0
    labels = read_idx(root, f"{split}-labels-idx1-ubyte").astype(np.int64)
    return torch.from_numpy(images).unsqueeze(1), torch.from_numpy(labels)


def make_model():
    return nn.Sequential(nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(7 * 7 * 64, 1024), nn.ReLU(), nn.Dropout(0.4), nn.Linear(1024, 10))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=100)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit-steps", type=int, default=0, help="stop after this many steps in all (smoke runs)")
    p.add_argument("--tf32", default="conv", choices=CHOICES, help="on a GPU: as evenflow's setting (torch_tf32.py)")
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    device = torch.device(a.device)
    if device.type == "cuda":
        print(set_tf32(a.tf32), flush=True)
    x_train, y_train = load(a.data, "train")
    x_test, y_test = load(a.data, "t10k")
    model = make_model().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=a.lr)
    step = 0
    for epoch in range(1, a.epochs + 1):
        model.train()
        order = torch.randperm(len(x_train))
        images, seconds = 0, 0.0
        for start in range(0, len(order), a.batch_size):
            t0 = time.perf_counter()
            idx = order[start:start + a.batch_size]
            x, y = x_train[idx].to(device), y_train[idx].to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()  # synchronizes, as classify's per-step loss read does
            seconds += time.perf_counter() - t0
            images += len(idx)
            step += 1
            if a.limit_steps and step >= a.limit_steps:
                break
        model.eval()
        correct = 0
        with torch.no_grad():
            for start in range(0, len(x_test), 1000):
                logits = model(x_test[start:start + 1000].to(device))
                correct += (logits.argmax(1).cpu() == y_test[start:start + 1000]).sum().item()
        print(f"epoch {epoch} seconds {seconds:.3f} images_per_s {images / seconds:.1f} "
              f"test_accuracy {correct / len(x_test):.4f}", flush=True)
        if a.limit_steps and step >= a.limit_steps:
            break


if __name__ == "__main__":
    main()
