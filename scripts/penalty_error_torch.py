#!/usr/bin/python3
"""The PyTorch side of scripts/bench_penalty.sh: how far bfloat16 moves the WGAN-GP penalty's
critic gradients from float64, in evenflow (--precision bf16) and in PyTorch (torch.autocast).

  inputs  --out FILE       writes the critic's weights (critic.<name>, float32, PyTorch's names: the
                           app's), a real batch (FashionMNIST, scaled to [-1, 1]), a generated batch
                           (the untrained generator of wgan_gp_torch.py) and the interpolation weights
                           eps, all float32. --critic-steps K first trains the critic K WGAN-GP critic
                           steps in float32 (Adam, lr 1e-4, betas (0, 0.9), as the app) against that
                           generator, so the gradients measured are those of a critic part-way through
                           training rather than at its initialisation.
  report  --inputs FILE --evenflow FILE
                           computes PyTorch's penalty gradients from the inputs in float64, float32 and
                           under torch.autocast("cpu", bfloat16) (critic forward, the input gradient with
                           create_graph and the penalty's norm inside autocast, as a training step
                           wraps its loss; the parameter gradients taken after it), reads evenflow's
                           (apps/tools/penalty_grads: float64, float32, bf16 as wgan_gp --precision bf16
                           computes, its first convolution in float32, bf16 with that one in bfloat16
                           too, and bf16 with the activations between the critic's layers stored in
                           bfloat16, as autocast stores them) and prints, per parameter
                           and then as max and median over the parameters, each one's relative error
                           |g - g64|_2 / |g64|_2 against PyTorch's float64 gradients. evenflow's float64
                           against PyTorch's shows that the two compute the same penalty (~1e-15).

Needs PyTorch 2.x (CPU autocast in bfloat16) and safetensors: scripts/bench_python.sh's."""
import argparse
import copy
import statistics
import sys

import torch
from safetensors.torch import load_file, save_file

from wgan_gp_torch import Critic, Generator, RealBatches, gradient_penalty, load_train_images


def penalty_at(critic, real, fake, eps, lam):
    """lambda * mean (|grad D(x^)|_2 - 1)^2 at x^ = eps * real + (1 - eps) * fake (the given eps)."""
    x = (eps * real + (1.0 - eps) * fake).requires_grad_(True)
    (g,) = torch.autograd.grad(critic(x).sum(), x, create_graph=True)
    return lam * ((g.flatten(1).norm(2, dim=1) - 1.0) ** 2).mean()


def write_inputs(a):
    torch.manual_seed(a.seed)
    critic, gen = Critic(a.width, a.norm), Generator(a.z_dim, a.width)
    reals = RealBatches(load_train_images(a.data), a.batch_size, "cpu")
    opt = torch.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.0, 0.9))
    for _ in range(a.critic_steps):
        real = reals.next()
        with torch.no_grad():
            fake = gen(torch.randn(real.size(0), a.z_dim))
        loss = critic(fake).mean() - critic(real).mean() + gradient_penalty(critic, real, fake, a.lam)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    real = reals.next()
    with torch.no_grad():
        fake = gen(torch.randn(real.size(0), a.z_dim))
    tensors = {"critic." + k: v.detach().contiguous() for k, v in critic.state_dict().items()
               if k in dict(critic.named_parameters())}
    tensors.update(real=real.contiguous(), fake=fake.contiguous(), eps=torch.rand(real.size(0), 1, 1, 1))
    save_file(tensors, a.out)


def torch_grads(a, inputs, mode):
    critic = Critic(a.width, a.norm)
    critic.load_state_dict({k[len("critic."):]: v for k, v in inputs.items() if k.startswith("critic.")},
                           strict=False)
    dtype = torch.float64 if mode == "float64" else torch.float32
    critic = copy.deepcopy(critic).to(dtype)
    real, fake, eps = (inputs[k].to(dtype) for k in ("real", "fake", "eps"))
    if mode == "autocast bf16":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            penalty = penalty_at(critic, real, fake, eps, a.lam)
    else:
        penalty = penalty_at(critic, real, fake, eps, a.lam)
    names = [n for n, _ in critic.named_parameters()]
    params = [p for _, p in critic.named_parameters()]
    grads = torch.autograd.grad(penalty, params, allow_unused=True, materialize_grads=True)
    return {n: g.detach().double() for n, g in zip(names, grads)}


def report(a):
    inputs = load_file(a.inputs)
    ours = load_file(a.evenflow)
    ref = torch_grads(a, inputs, "float64")
    # Parameters the penalty does not depend on (fc.bias; the LayerNorm's bias only through
    # LeakyReLU's piecewise-constant slope) have a zero gradient in every column: no relative error.
    unused = [n for n in ref if ref[n].norm().item() == 0.0]
    ref = {n: g for n, g in ref.items() if n not in unused}
    columns = {
        "evenflow float64": {n: ours["float64." + n].double() for n in ref},
        "evenflow float32": {n: ours["float32." + n].double() for n in ref},
        "evenflow bf16": {n: ours["bf16." + n].double() for n in ref},
        "evenflow bf16, conv1 too": {n: ours["bf16_all." + n].double() for n in ref},
        "evenflow bf16, bf16 storage": {n: ours["bf16_storage." + n].double() for n in ref},
        "PyTorch float32": torch_grads(a, inputs, "float32"),
        "PyTorch autocast bf16": torch_grads(a, inputs, "autocast bf16"),
    }
    errors = {c: {n: ((g[n] - ref[n]).norm() / ref[n].norm()).item() for n in ref} for c, g in columns.items()}
    print(f"PyTorch {torch.__version__}; relative error |g - g64|_2 / |g64|_2 of the penalty's gradient per "
          f"parameter, against PyTorch float64 (critic width {a.width}, {a.norm}, batch {inputs['real'].size(0)})")
    width = max(len(n) for n in ref) + 2
    col = max(len(c) for c in columns) + 2  # every header apart from its neighbours
    print("parameter".ljust(width) + "".join(c.rjust(col) for c in columns))
    for n in ref:
        print(n.ljust(width) + "".join(f"{errors[c][n]:{col}.2e}" for c in columns))
    for label, fn in (("max", max), ("median", statistics.median)):
        print(label.ljust(width) + "".join(f"{fn(errors[c].values()):{col}.2e}" for c in columns))
    if unused:
        print("zero in float64 (the penalty does not depend on them), left out: " + ", ".join(unused))
    worst = {c: max(errors[c], key=errors[c].get) for c in columns}
    print("worst: " + "; ".join(f"{c}: {worst[c]}" for c in columns if "bf16" in c))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", choices=["inputs", "report"])
    p.add_argument("--out", help="inputs: the file to write")
    p.add_argument("--inputs", help="report: the inputs file")
    p.add_argument("--evenflow", help="report: apps/tools/penalty_grads's output")
    p.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--norm", default="layernorm", choices=["none", "layernorm"],
                   help="the critic's normalization (a batch norm would differ between the frameworks' "
                        "batch statistics only in their rounding, but is left out for clarity)")
    p.add_argument("--z-dim", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--critic-steps", type=int, default=0)
    p.add_argument("--lambda", dest="lam", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    if a.command == "inputs":
        if not a.out:
            p.error("inputs needs --out")
        write_inputs(a)
    else:
        if not (a.inputs and a.evenflow):
            p.error("report needs --inputs and --evenflow")
        report(a)


if __name__ == "__main__":
    sys.exit(main())
