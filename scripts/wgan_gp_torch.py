#!/usr/bin/python3
"""The PyTorch twin of apps/wgan_gp, for scripts/bench_wgan_gp.sh: the same WGAN-GP training step on
FashionMNIST, timed. Single device only: PyTorch's best single-device step (eager, one process) is the
baseline, whatever number of devices evenflow is given.

  Generator: Linear(z, 2w*7*7)-BatchNorm1d-ReLU-reshape [2w,7,7]-ConvTranspose2d(2w,w,4,2,1)-BatchNorm2d-ReLU-
             ConvTranspose2d(w,1,4,2,1)-tanh
  Critic:    Conv2d(1,w,4,2,1)-LeakyReLU(0.2)-Conv2d(w,2w,4,2,1)-norm-LeakyReLU(0.2)-flatten-Linear(2w*49,1),
             norm: none, layernorm (LayerNorm([2w,7,7])), batchnorm (BatchNorm2d; syncbn is the app's name
             for it, the same thing on one device)
  Step:      --critic-steps critic steps, each on the next shuffled batch of real images (scaled to [-1,1])
             and a fresh fake batch: mean D(fake) - mean D(real) + lambda * mean (|grad D(x^)|_2 - 1)^2 at
             random interpolates x^ (torch.autograd.grad, create_graph=True); then one generator step,
             -mean D(G(z)), with the critic frozen. Adam(lr 1e-4, betas (0, 0.9)) for both networks.
             Each loss is read with .item(), as the app does (it logs them).

Arithmetic as evenflow's: float32 with TF32 in convolutions only, the default of both (--tf32 conv; all
or none must match the evenflow run's setting). cudnn.benchmark is on (the shapes never change; the
warm-up steps pay for the search) unless --no-cudnn-benchmark (evenflow takes cuDNN's heuristic choice).

Timing: --warmup generator steps, then --steps timed ones (torch.cuda.synchronize() at both ends on
CUDA). Prints one line:
    images_per_s <x> seconds_per_step <y>
where images are the real images the critic steps consume (batch * critic_steps per generator step),
as the app's images/s counts. Runs with Debian's python3-torch (1.13) or PyTorch 2.x; needs only
torch and numpy."""
import argparse
import sys
import time

import numpy as np
import torch
import torch.nn as nn

from fashion_idx import read_idx  # scripts/fashion_idx.py
from torch_tf32 import CHOICES, set_tf32  # scripts/torch_tf32.py


def load_train_images(root):
    """FashionMNIST's training images as [N, 1, 28, 28] float32 in [-1, 1], on the host."""
    images = read_idx(root, "train-images-idx3-ubyte").astype(np.float32) / 255.0
    return torch.from_numpy(images * 2.0 - 1.0).unsqueeze(1)


class Generator(nn.Module):
    def __init__(self, z_dim, width):
        super().__init__()
        self.width = width
        self.fc = nn.Linear(z_dim, 2 * width * 7 * 7)
        self.bn0 = nn.BatchNorm1d(2 * width * 7 * 7)
        self.up1 = nn.ConvTranspose2d(2 * width, width, 4, stride=2, padding=1)
        self.bn1 = nn.BatchNorm2d(width)
        self.up2 = nn.ConvTranspose2d(width, 1, 4, stride=2, padding=1)

    def forward(self, z):
        h = torch.relu(self.bn0(self.fc(z)))
        h = h.reshape(z.size(0), 2 * self.width, 7, 7)
        h = torch.relu(self.bn1(self.up1(h)))
        return torch.tanh(self.up2(h))


class Critic(nn.Module):
    def __init__(self, width, norm):
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 4, stride=2, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 4, stride=2, padding=1)
        if norm == "layernorm":
            self.norm = nn.LayerNorm([2 * width, 7, 7])
        elif norm in ("batchnorm", "syncbn"):
            self.norm = nn.BatchNorm2d(2 * width)
        else:
            self.norm = nn.Identity()
        self.fc = nn.Linear(2 * width * 7 * 7, 1)

    def forward(self, x):
        h = nn.functional.leaky_relu(self.conv1(x), 0.2)
        h = nn.functional.leaky_relu(self.norm(self.conv2(h)), 0.2)
        return self.fc(h.flatten(1)).reshape(x.size(0))


def gradient_penalty(critic, real, fake, lam):
    """lambda * mean (|grad D(x^)|_2 - 1)^2, x^ = eps * real + (1 - eps) * fake, eps ~ U[0, 1) per sample."""
    eps = torch.rand(real.size(0), 1, 1, 1, device=real.device)
    x = (eps * real + (1.0 - eps) * fake).requires_grad_(True)
    (g,) = torch.autograd.grad(critic(x).sum(), x, create_graph=True)
    return lam * ((g.flatten(1).norm(2, dim=1) - 1.0) ** 2).mean()


class RealBatches:
    """Shuffled batches of the training images, the last partial batch of an epoch dropped (as the
    app's loader: shuffle, drop_last), a new order each epoch."""

    def __init__(self, images, batch_size, device):
        self.images, self.batch_size, self.device = images, batch_size, device
        self.per_epoch = len(images) // batch_size
        if self.per_epoch == 0:
            sys.exit(f"wgan_gp_torch.py: the training set has fewer images ({len(images)}) than a batch ({batch_size})")
        self.position = self.per_epoch

    def next(self):
        if self.position == self.per_epoch:
            self.order, self.position = torch.randperm(len(self.images)), 0
        idx = self.order[self.position * self.batch_size:(self.position + 1) * self.batch_size]
        self.position += 1
        return self.images[idx].to(self.device)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--steps", type=int, default=2000, help="timed generator steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=5, help="untimed generator steps first")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--critic-steps", type=int, default=5, help="critic steps per generator step")
    p.add_argument("--lambda", dest="lam", type=float, default=10.0, help="penalty weight")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--beta1", type=float, default=0.0)
    p.add_argument("--beta2", type=float, default=0.9)
    p.add_argument("--width", type=int, default=32, help="channels of the first critic / last generator layer")
    p.add_argument("--z-dim", type=int, default=128)
    p.add_argument("--norm", default="layernorm", choices=["none", "layernorm", "batchnorm", "syncbn"],
                   help="critic normalization (syncbn: batchnorm, the app's name)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="one device: cuda, cuda:N, cpu")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: torch's default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tf32", default="conv", choices=CHOICES,
                   help="conv (default: PyTorch's and evenflow's), all or none (torch_tf32.py)")
    p.add_argument("--autocast", default="none", choices=["none", "bf16"],
                   help="bf16: each network's forward, the critic loss and the penalty (its input gradient "
                        "and norm) under torch.autocast(bfloat16), the parameter gradients and Adam after it "
                        "(apps/wgan_gp --precision bf16's counterpart; PyTorch 2.x)")
    p.add_argument("--no-cudnn-benchmark", action="store_true", help="cuDNN's heuristic algorithms, no search")
    a = p.parse_args()
    for name in ("steps", "batch_size", "critic_steps", "width", "z_dim"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(a, name)}")
    if a.warmup < 0:
        p.error(f"--warmup must be non-negative, got {a.warmup}")
    if "," in a.device:
        p.error(f"--device takes one device, got {a.device}")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    if cuda:
        print(set_tf32(a.tf32))
        torch.backends.cudnn.benchmark = not a.no_cudnn_benchmark

    reals = RealBatches(load_train_images(a.data), a.batch_size, device)
    gen = Generator(a.z_dim, a.width).to(device)
    critic = Critic(a.width, a.norm).to(device)
    opt_g = torch.optim.Adam(gen.parameters(), lr=a.lr, betas=(a.beta1, a.beta2))
    opt_d = torch.optim.Adam(critic.parameters(), lr=a.lr, betas=(a.beta1, a.beta2))
    print(f"PyTorch {torch.__version__} on {device}, batch {a.batch_size}, {a.critic_steps} critic steps per "
          f"generator step, norm {a.norm}, {a.warmup} warm-up + {a.steps} timed steps", file=sys.stderr, flush=True)

    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.autocast == "bf16")

    def generator_step():
        for _ in range(a.critic_steps):
            real = reals.next()
            z = torch.randn(real.size(0), a.z_dim, device=device)
            with torch.no_grad(), autocast():
                fake = gen(z)
            with autocast():
                d_real, d_fake = critic(real), critic(fake)
                loss = d_fake.mean() - d_real.mean() + gradient_penalty(critic, real, fake, a.lam)
            opt_d.zero_grad(set_to_none=True)
            loss.backward()
            opt_d.step()
            # The critic loss and the Wasserstein estimate, read as the app reads them (one sync).
            torch.stack([loss.detach(), (d_real.mean() - d_fake.mean()).detach()]).tolist()
        z = torch.randn(a.batch_size, a.z_dim, device=device)
        critic.requires_grad_(False)
        with autocast():
            loss = -critic(gen(z)).mean()
        opt_g.zero_grad(set_to_none=True)
        loss.backward()
        opt_g.step()
        critic.requires_grad_(True)
        loss.item()

    for _ in range(a.warmup):
        generator_step()
    if cuda:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        generator_step()
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    images = a.steps * a.batch_size * a.critic_steps
    print(f"images_per_s {images / seconds:.1f} seconds_per_step {seconds / a.steps:.6f}", flush=True)


if __name__ == "__main__":
    main()
