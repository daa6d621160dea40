#!/usr/bin/python3
"""The PyTorch twin of apps/wgan_gp, for scripts/bench_wgan_gp.sh: the same WGAN-GP training step, timed.
Single device only: PyTorch's best single-device step (one process; eager, or one CUDA graph with
--cuda-graph) is the baseline, whatever number of devices evenflow is given.

--model dcgan (default), on FashionMNIST (--data), width w (--width, default 32):
  Generator: Linear(z, 2w*7*7)-BatchNorm1d-ReLU-reshape [2w,7,7]-ConvTranspose2d(2w,w,4,2,1)-BatchNorm2d-ReLU-
             ConvTranspose2d(w,1,4,2,1)-tanh
  Critic:    Conv2d(1,w,4,2,1)-LeakyReLU(0.2)-Conv2d(w,2w,4,2,1)-norm-LeakyReLU(0.2)-flatten-Linear(2w*49,1),
             norm (--norm, default layernorm): none, layernorm (LayerNorm([2w,7,7])), batchnorm (BatchNorm2d;
             syncbn is the app's name for it, the same thing on one device)
--model resnet: the WGAN-GP paper's CIFAR-10 ResNet (Gulrajani et al. 2017, gan_cifar_resnet.py, unconditional)
  on 32x32x3 images, D = DIM_G = DIM_D = --width (default 128 for this model), z 128:
  ResBlock(in, out, resample): shortcut + main, main = norm-ReLU-conv1-norm-ReLU-conv2, every convolution
             with bias and padding k//2; resample down: conv1 Conv3x3(in,in), conv2 ConvMeanPool3x3(in,out)
             (convolution, then 2x2 average pooling), shortcut ConvMeanPool1x1; up: conv1 UpsampleConv3x3(in,out)
             (nearest 2x upsampling, then convolution), conv2 Conv3x3(out,out), shortcut UpsampleConv1x1; none:
             Conv3x3(in,out), Conv3x3(out,out), shortcut identity (in == out) or Conv1x1
  Generator: Linear(z, 4*4*D)-reshape [D,4,4]-ResBlock(D,D,up) x3 (4->8->16->32)-BatchNorm2d-ReLU-
             Conv3x3(D,3)-tanh; norm in its blocks: BatchNorm2d
  Critic:    OptimizedBlock (shortcut MeanPoolConv1x1(3,D): 2x2 average pooling, then convolution; main
             Conv3x3(3,D)-ReLU-ConvMeanPool3x3(D,D); 16x16)-ResBlock(D,D,down) (8x8)-ResBlock(D,D,none) x2-ReLU-
             mean over H and W-Linear(D,1); no normalization in its blocks (the paper's NORMALIZATION_D = False),
             so --norm must be none (its default for this model)
  Data:      synthetic, no data set (--data is ignored): a fixed pool of 64*32 images drawn once, uniform in
             [-1, 1], from a torch.Generator seeded with --seed, taken batch after batch in order, cycled.

  Step:      --critic-steps critic steps, each on the next batch of real images (dcgan: shuffled FashionMNIST
             scaled to [-1,1]) and a fresh fake batch: mean D(fake) - mean D(real) + lambda * mean
             (|grad D(x^)|_2 - 1)^2 at random interpolates x^ (torch.autograd.grad, create_graph=True); then one
             generator step, -mean D(G(z)), with the critic frozen. Adam(lr 1e-4, betas (0, 0.9)) for both
             networks. Each loss is read on the host (.item()/.tolist()), as the app does (it logs them).

--cuda-graph (CUDA devices only): the strongest PyTorch a user can write for this step. The whole generator
step above (all the critic steps with their double-backward penalties and Adam steps, then the generator
step and its Adam step) is captured once into one torch.cuda.CUDAGraph and replayed, as the "Whole-network
capture" of PyTorch's CUDA Graphs notes: --warmup eager steps on a side stream (torch.cuda.Stream,
wait_stream) on the same static tensors, then the capture (torch.cuda.graph, on that stream), one untimed
replay (the graph's first launch), then the timed replays. Both Adams are capturable=True; every grad is
set to None inside the captured step, as the eager step does. Before each replay, outside the graph, its
static GPU inputs are filled with copy_(): the real batch of each critic step (from the host, as eager's
batches), the noise z of each critic step and of the generator step and the interpolation weights eps of
each critic step (drawn on the host, not in the graph). The graph writes the losses into a static tensor,
which is read on the host after each replay (one .tolist()). If PyTorch cannot capture or replay the step,
the script prints, in place of its figures, one line
    cuda_graph_error: <exception type>: <the message's first line>
(and the traceback's last frames on stderr), and exits with status 3.

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
import os
import sys
import time
import traceback
import warnings

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from fashion_idx import read_idx  # scripts/fashion_idx.py
from torch_tf32 import CHOICES, set_tf32  # scripts/torch_tf32.py

GRAPH_ERROR_STATUS = 3  # the exit status when --cuda-graph cannot capture or replay the step
SYNTHETIC_IMAGES = 64 * 32  # the resnet model's pool of synthetic images


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


# The WGAN-GP paper's CIFAR-10 ResNet (gan_cifar_resnet.py). Every convolution has a bias and padding k//2.
def conv(cin, cout, k):
    return nn.Conv2d(cin, cout, k, padding=k // 2)


class ConvMeanPool(nn.Module):
    """Convolution, then 2x2 average pooling."""

    def __init__(self, cin, cout, k):
        super().__init__()
        self.conv = conv(cin, cout, k)

    def forward(self, x):
        return F.avg_pool2d(self.conv(x), 2)


class MeanPoolConv(nn.Module):
    """2x2 average pooling, then convolution."""

    def __init__(self, cin, cout, k):
        super().__init__()
        self.conv = conv(cin, cout, k)

    def forward(self, x):
        return self.conv(F.avg_pool2d(x, 2))


class UpsampleConv(nn.Module):
    """Nearest 2x upsampling (the paper's four copies through depth_to_space), then convolution."""

    def __init__(self, cin, cout, k):
        super().__init__()
        self.conv = conv(cin, cout, k)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2, mode="nearest"))


class ResidualBlock(nn.Module):
    """shortcut(x) + conv2(ReLU(norm2(conv1(ReLU(norm1(x)))))), norm BatchNorm2d (batchnorm) or none;
    resample "down", "up" or None (the module docstring says which convolutions each takes)."""

    def __init__(self, cin, cout, resample, batchnorm):
        super().__init__()
        if resample == "down":
            self.conv1, self.conv2 = conv(cin, cin, 3), ConvMeanPool(cin, cout, 3)
            self.shortcut, mid = ConvMeanPool(cin, cout, 1), cin
        elif resample == "up":
            self.conv1, self.conv2 = UpsampleConv(cin, cout, 3), conv(cout, cout, 3)
            self.shortcut, mid = UpsampleConv(cin, cout, 1), cout
        else:
            self.conv1, self.conv2 = conv(cin, cout, 3), conv(cout, cout, 3)
            self.shortcut = nn.Identity() if cin == cout else conv(cin, cout, 1)
            mid = cout
        self.norm1 = nn.BatchNorm2d(cin) if batchnorm else nn.Identity()
        self.norm2 = nn.BatchNorm2d(mid) if batchnorm else nn.Identity()

    def forward(self, x):
        h = self.conv1(torch.relu(self.norm1(x)))
        return self.shortcut(x) + self.conv2(torch.relu(self.norm2(h)))


class ResNetGenerator(nn.Module):
    def __init__(self, z_dim, width):
        super().__init__()
        self.width = width
        self.fc = nn.Linear(z_dim, 4 * 4 * width)
        self.blocks = nn.Sequential(*(ResidualBlock(width, width, "up", batchnorm=True) for _ in range(3)))
        self.bn = nn.BatchNorm2d(width)
        self.out = conv(width, 3, 3)

    def forward(self, z):
        h = self.blocks(self.fc(z).reshape(z.size(0), self.width, 4, 4))  # [N,D,4,4] -> [N,D,32,32]
        return torch.tanh(self.out(torch.relu(self.bn(h))))


class ResNetCritic(nn.Module):
    def __init__(self, width):
        super().__init__()
        # OptimizedBlock: 32x32 -> 16x16.
        self.shortcut1 = MeanPoolConv(3, width, 1)
        self.conv1a, self.conv1b = conv(3, width, 3), ConvMeanPool(width, width, 3)
        self.blocks = nn.Sequential(ResidualBlock(width, width, "down", batchnorm=False),  # 16x16 -> 8x8
                                    ResidualBlock(width, width, None, batchnorm=False),
                                    ResidualBlock(width, width, None, batchnorm=False))
        self.fc = nn.Linear(width, 1)

    def forward(self, x):
        h = self.shortcut1(x) + self.conv1b(torch.relu(self.conv1a(x)))
        h = torch.relu(self.blocks(h)).mean(dim=(2, 3))  # [N,D]
        return self.fc(h).reshape(x.size(0))


def gradient_penalty(critic, real, fake, lam, eps=None):
    """lambda * mean (|grad D(x^)|_2 - 1)^2, x^ = eps * real + (1 - eps) * fake, eps ~ U[0, 1) per sample
    (drawn here on real's device unless given, [N,1,1,1])."""
    if eps is None:
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

    def next_host(self):
        """The next batch, on the host."""
        if self.position == self.per_epoch:
            self.order, self.position = torch.randperm(len(self.images)), 0
        idx = self.order[self.position * self.batch_size:(self.position + 1) * self.batch_size]
        self.position += 1
        return self.images[idx]

    def next(self):
        return self.next_host().to(self.device)


class SyntheticBatches:
    """The resnet model's real images: SYNTHETIC_IMAGES images [3,32,32], uniform in [-1, 1], drawn once from
    a torch.Generator seeded with `seed`, on the host; batches taken in order, cycling through the pool."""

    def __init__(self, batch_size, seed, device):
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.rand(SYNTHETIC_IMAGES, 3, 32, 32, generator=generator) * 2.0 - 1.0
        self.batch_size, self.device, self.position = batch_size, device, 0

    def next_host(self):
        """The next batch, on the host."""
        n = len(self.images)
        if self.position + self.batch_size <= n:
            batch = self.images[self.position:self.position + self.batch_size]
        else:
            batch = self.images[torch.arange(self.position, self.position + self.batch_size) % n]
        self.position = (self.position + self.batch_size) % n
        return batch

    def next(self):
        return self.next_host().to(self.device)


def exit_graph_error(error, cause=None):
    """--cuda-graph's failure: one line `cuda_graph_error: <type>: <message's first line>` on stdout, naming
    `cause` (what the captured step raised, when ending the capture then raised `error` too) or else `error`;
    the traceback's last frames on stderr; exit status 3. os._exit: after a failed capture the CUDA context
    may be unusable, and the destructors a normal exit runs could abort instead."""
    shown = cause if cause is not None else error
    lines = str(shown).strip().splitlines()
    print(f"cuda_graph_error: {type(shown).__name__}: {lines[0] if lines else ''}", flush=True)
    traceback.print_exception(type(error), error, error.__traceback__, limit=-6, file=sys.stderr)
    sys.stderr.flush()
    os._exit(GRAPH_ERROR_STATUS)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="dcgan", choices=["dcgan", "resnet"],
                   help="dcgan (FashionMNIST) or resnet (the WGAN-GP paper's CIFAR-10 ResNet, synthetic images)")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist", help="FashionMNIST (dcgan; resnet: unused)")
    p.add_argument("--steps", type=int, default=2000, help="timed generator steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=5, help="untimed generator steps first")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--critic-steps", type=int, default=5, help="critic steps per generator step")
    p.add_argument("--lambda", dest="lam", type=float, default=10.0, help="penalty weight")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--beta1", type=float, default=0.0)
    p.add_argument("--beta2", type=float, default=0.9)
    p.add_argument("--width", type=int, default=None,
                   help="dcgan: channels of the first critic / last generator layer (default 32); resnet: the "
                        "channels D of every block (default 128)")
    p.add_argument("--z-dim", type=int, default=128)
    p.add_argument("--norm", default=None, choices=["none", "layernorm", "batchnorm", "syncbn"],
                   help="critic normalization (syncbn: batchnorm, the app's name); default layernorm for dcgan, "
                        "none for resnet (which takes only none)")
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
    p.add_argument("--cuda-graph", action="store_true",
                   help="capture one whole generator step into one CUDA graph after the warm-up and replay it "
                        "(CUDA only; exit status 3 and a cuda_graph_error line when PyTorch cannot)")
    a = p.parse_args()
    if a.width is None:
        a.width = 128 if a.model == "resnet" else 32
    if a.norm is None:
        a.norm = "none" if a.model == "resnet" else "layernorm"
    for name in ("steps", "batch_size", "critic_steps", "width", "z_dim"):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive, got {getattr(a, name)}")
    if a.warmup < 0:
        p.error(f"--warmup must be non-negative, got {a.warmup}")
    if "," in a.device:
        p.error(f"--device takes one device, got {a.device}")
    if a.model == "resnet" and a.norm != "none":
        p.error(f"--model resnet has no normalization in its critic (the paper's): --norm must be none, got {a.norm}")
    device = torch.device(a.device)
    cuda = device.type == "cuda"
    if a.cuda_graph and not cuda:
        p.error(f"--cuda-graph captures CUDA work: it needs a CUDA --device (cuda, cuda:N), got {a.device}")
    if a.cuda_graph and a.warmup < 1:
        p.error("--cuda-graph needs --warmup 1 or more: the capture must follow eager warm-up steps (PyTorch's "
                "CUDA Graphs notes)")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    if cuda:
        print(set_tf32(a.tf32))
        torch.backends.cudnn.benchmark = not a.no_cudnn_benchmark

    if a.model == "resnet":
        reals = SyntheticBatches(a.batch_size, a.seed, device)
        gen = ResNetGenerator(a.z_dim, a.width).to(device)
        critic = ResNetCritic(a.width).to(device)
    else:
        reals = RealBatches(load_train_images(a.data), a.batch_size, device)
        gen = Generator(a.z_dim, a.width).to(device)
        critic = Critic(a.width, a.norm).to(device)
    # capturable: Adam keeps its step counts on the device and updates them there, so a graph can replay it.
    opt_g = torch.optim.Adam(gen.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), capturable=a.cuda_graph)
    opt_d = torch.optim.Adam(critic.parameters(), lr=a.lr, betas=(a.beta1, a.beta2), capturable=a.cuda_graph)
    print(f"PyTorch {torch.__version__} on {device}, model {a.model}, width {a.width}, batch {a.batch_size}, "
          f"{a.critic_steps} critic steps per generator step, norm {a.norm}, {a.warmup} warm-up + {a.steps} timed "
          f"steps{', one CUDA graph per step' if a.cuda_graph else ''}", file=sys.stderr, flush=True)

    def autocast():
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=a.autocast == "bf16")

    def critic_update(real, z, eps=None):
        """One critic step on a real batch, noise z and interpolation weights eps (None: drawn in the penalty);
        returns the critic loss and the Wasserstein estimate, detached."""
        with torch.no_grad(), autocast():
            fake = gen(z)
        with autocast():
            d_real, d_fake = critic(real), critic(fake)
            loss = d_fake.mean() - d_real.mean() + gradient_penalty(critic, real, fake, a.lam, eps)
        opt_d.zero_grad(set_to_none=True)
        loss.backward()
        opt_d.step()
        return loss.detach(), (d_real.mean() - d_fake.mean()).detach()

    def generator_update(z):
        """One generator step on noise z, the critic frozen; returns the generator loss, detached."""
        critic.requires_grad_(False)
        with autocast():
            loss = -critic(gen(z)).mean()
        opt_g.zero_grad(set_to_none=True)
        loss.backward()
        opt_g.step()
        critic.requires_grad_(True)
        return loss.detach()

    def generator_step():
        for _ in range(a.critic_steps):
            real = reals.next()
            z = torch.randn(real.size(0), a.z_dim, device=device)
            # The critic loss and the Wasserstein estimate, read as the app reads them (one sync).
            torch.stack(critic_update(real, z)).tolist()
        z = torch.randn(a.batch_size, a.z_dim, device=device)
        generator_update(z).item()

    if a.cuda_graph:
        step = graphed_step(a, device, reals, critic_update, generator_update, opt_d, opt_g)
    else:
        for _ in range(a.warmup):
            generator_step()
        step = generator_step
    if cuda:
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - t0
    images = a.steps * a.batch_size * a.critic_steps
    print(f"images_per_s {images / seconds:.1f} seconds_per_step {seconds / a.steps:.6f}", flush=True)


def graphed_step(a, device, reals, critic_update, generator_update, opt_d, opt_g):
    """--cuda-graph: runs the --warmup eager steps on a side stream, captures one whole generator step on
    static tensors into one torch.cuda.CUDAGraph, replays it once (untimed), and returns the timed step:
    fill the static inputs (outside the graph), replay, read the losses. Exits through exit_graph_error
    when the capture or that first replay fails."""
    if device.index is not None:  # "cuda" names no index: the current device, as it is
        torch.cuda.set_device(device)
    k_steps, batch = a.critic_steps, a.batch_size
    image = reals.images.shape[1:]  # [C,H,W]
    static_real = torch.empty(k_steps, batch, *image, device=device)  # the real batch of each critic step
    static_z = torch.empty(k_steps + 1, batch, a.z_dim, device=device)  # each critic step's noise, then the generator's
    static_eps = torch.empty(k_steps, batch, 1, 1, 1, device=device)  # each critic step's interpolation weights
    # Row k < K: critic step k's loss and Wasserstein estimate; row K: the generator loss (and 0).
    static_losses = torch.zeros(k_steps + 1, 2, device=device)

    def fill():
        """Copies the next step's inputs into the static tensors, on the current stream."""
        for k in range(k_steps):
            static_real[k].copy_(reals.next_host())
        static_z.copy_(torch.randn(k_steps + 1, batch, a.z_dim))
        static_eps.copy_(torch.rand(k_steps, batch, 1, 1, 1))

    def static_step():
        """One whole generator step on the static tensors; what torch.cuda.graph captures."""
        for k in range(k_steps):
            static_losses[k].copy_(torch.stack(critic_update(static_real[k], static_z[k], static_eps[k])))
        static_losses[k_steps, 0].copy_(generator_update(static_z[k_steps]))

    # Warm-up on a side stream (PyTorch's CUDA Graphs notes, whole-network capture): cuDNN's algorithm
    # search, the cuBLAS handles and workspaces, Adam's state are all made here, before the capture. (A
    # capturable Adam stepping outside a capture warns that capturable=True may be slower: it is meant.)
    warnings.filterwarnings("ignore", message="This instance was constructed with capturable=True")
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(a.warmup):
            fill()
            static_step()
            static_losses.tolist()
    torch.cuda.current_stream(device).wait_stream(side)

    graph = torch.cuda.CUDAGraph()
    # The grads are None when the capture starts, so its backward passes allocate them from the graph's pool.
    opt_d.zero_grad(set_to_none=True)
    opt_g.zero_grad(set_to_none=True)
    raised = []  # what the captured step itself raised: the cause, when ending the capture raises too
    try:
        with torch.cuda.graph(graph, stream=side):  # the warm-up's stream: its handles are made already
            try:
                static_step()
            except Exception as error:
                raised.append(error)
                raise
        fill()
        graph.replay()  # the first launch uploads the graph: untimed
        static_losses.tolist()
    except Exception as error:
        exit_graph_error(error, raised[0] if raised else None)

    def step():
        try:
            fill()
            graph.replay()
            static_losses.tolist()  # every loss of the step, read on the host as the eager step reads them
        except Exception as error:
            exit_graph_error(error)

    return step


if __name__ == "__main__":
    main()
