"""The same cases as apps/bench_engine.cpp, in PyTorch, printed in the same format.

Run by scripts/bench_engine.sh so that both are measured in one run on the same machine.
"""
import argparse
import sys
import time

import torch

from torch_tf32 import CHOICES, set_tf32


def time_it(fn, device, min_seconds):
    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    fn()
    fn()
    sync()
    times = []
    while len(times) < 3 or (sum(times) < min_seconds and len(times) < 50):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def report_failure(name, error):
    """The row of a case that raised: `name<TAB>failed<TAB>reason`, the reason on one line."""
    reason = " ".join(f"{type(error).__name__}: {error}".split())
    print(f"{name}\tfailed\t{reason[:300]}", flush=True)


def attempt(name, fn):
    """Runs fn (a case, or a group's setup and cases); one that raises costs its row, not the table."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 -- any failure of one case, reported and passed over
        report_failure(name, e)


def report(name, seconds, amount, unit):
    print(f"{name}\t{seconds:.6f}\t{amount / seconds / 1e9:.2f}\t{unit}", flush=True)


def report_latency(name, seconds, per):
    print(f"{name}\t{seconds / per:.9f}\t{seconds / per * 1e6:.3f}\tus/op", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--min-seconds", type=float, default=1.0)
    p.add_argument("--only", default="")
    p.add_argument("--tf32", default="conv", choices=CHOICES, help="as bench_engine's --tf32 (torch_tf32.py)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"],
                   help="bf16: the matmul and conv cases under torch.autocast(bfloat16), their outputs cast back to "
                        "float32 (as bench_engine's --precision bf16, whose products return float32)")
    a = p.parse_args()
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    dev = a.device
    if dev.startswith("cuda"):
        print(set_tf32(a.tf32), file=sys.stderr)
        torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    kw = dict(device=dev, dtype=torch.float32)
    bf16 = a.precision == "bf16"
    F = torch.nn.functional

    def mixed(fn):  # fn under autocast(bfloat16) with a float32 result, or fn itself
        if not bf16:
            return fn

        def run():
            with torch.autocast(dev.split(":")[0], dtype=torch.bfloat16):
                return fn().float()
        return run

    def timed(name, fn, amount, unit):  # one row: fn's rate, or the row "failed"
        attempt(name, lambda: report(name, time_it(fn, dev, a.min_seconds), amount, unit))

    def timed_latency(name, fn, per):
        attempt(name, lambda: report_latency(name, time_it(fn, dev, a.min_seconds), per))

    def wanted(name):
        return not a.only or a.only in name

    # Each group's setup runs under attempt() too, named by the group: a setup that raises costs the
    # group's row, and the cases after it still run.
    def matmul_case(name, m, k, n):
        x, y = torch.randn(m, k, **kw), torch.randn(k, n, **kw)
        flops = 2.0 * m * k * n
        with torch.no_grad():
            timed(name + "_fwd", mixed(lambda: x @ y), flops, "GFLOP/s")
        xg, yg = x.clone().requires_grad_(), y.clone().requires_grad_()
        gy = torch.randn(m, n, **kw)
        product = mixed(lambda: xg @ yg)
        timed(name + "_fwdbwd", lambda: product().backward(gy), 3 * flops, "GFLOP/s")

    for m, k, n in [(1024, 1024, 1024), (4096, 1024, 1024), (100, 3136, 1024)]:
        name = f"matmul_{m}x{k}x{n}"
        if wanted(name):
            attempt(name, lambda: matmul_case(name, m, k, n))

    def conv_case(name, n, c, h, w, o, k, pad):
        x, wt = torch.randn(n, c, h, w, **kw), torch.randn(o, c, k, k, **kw)
        flops = 2.0 * n * o * h * w * c * k * k
        with torch.no_grad():
            timed(name + "_fwd", mixed(lambda: F.conv2d(x, wt, padding=pad)), flops, "GFLOP/s")
        xg, wg = x.clone().requires_grad_(), wt.clone().requires_grad_()
        gy = torch.randn(n, o, h, w, **kw)
        conv = mixed(lambda: F.conv2d(xg, wg, padding=pad))
        timed(name + "_fwdbwd", lambda: conv().backward(gy), 3 * flops, "GFLOP/s")

    for name, n, c, h, w, o, k, pad in [("conv_fmnist1_100x1x28x28_k5x32", 100, 1, 28, 28, 32, 5, 2),
                                        ("conv_fmnist2_100x32x14x14_k5x64", 100, 32, 14, 14, 64, 5, 2),
                                        ("conv_resnet_32x64x56x56_k3x64", 32, 64, 56, 56, 64, 3, 1)]:
        if wanted(name):
            attempt(name, lambda: conv_case(name, n, c, h, w, o, k, pad))

    def norm_case(name, shape, features):
        x, gy = torch.randn(*shape, **kw), torch.randn(*shape, **kw)
        w, b = torch.ones(features, **kw).requires_grad_(), torch.zeros(features, **kw).requires_grad_()
        norm = (lambda t: F.layer_norm(t, (features,), w, b)) if name.startswith("layer") else \
            (lambda t: F.batch_norm(t, None, None, w, b, training=True))
        with torch.no_grad():
            timed(name + "_fwd", lambda: norm(x), x.numel(), "Gelem/s")
        xg = x.clone().requires_grad_()
        timed(name + "_fwdbwd", lambda: norm(xg).backward(gy), x.numel(), "Gelem/s")

    for name, shape, features in [("layer_norm_8192x1024", (8192, 1024), 1024),
                                  ("batch_norm_32x64x56x56", (32, 64, 56, 56), 64),
                                  ("batch_norm_64x3136", (64, 3136), 3136)]:
        if wanted(name):
            attempt(name, lambda: norm_case(name, shape, features))

    def pointwise():
        x, pixels = torch.randn(4096, 1024, **kw), torch.randn(8, 21, 128, 128, **kw)
        with torch.no_grad():
            timed("pointwise_exp_4096x1024", lambda: x.exp(), x.numel(), "Gelem/s")
            timed("pointwise_sigmoid_4096x1024", lambda: x.sigmoid(), x.numel(), "Gelem/s")
            timed("pointwise_softplus_4096x1024", lambda: F.softplus(x, 1.0, 20.0), x.numel(), "Gelem/s")
            timed("pointwise_erf_4096x1024", lambda: torch.erf(x), x.numel(), "Gelem/s")
            timed("softmax_4096x1024", lambda: torch.softmax(x, 1), x.numel(), "Gelem/s")
            timed("log_softmax_8x21x128x128_dim1", lambda: torch.log_softmax(pixels, 1), pixels.numel(), "Gelem/s")

    if not a.only or a.only in "pointwise_exp softmax":
        attempt("pointwise", pointwise)

    def arg_reductions():
        x, pixels = torch.randn(4096, 1024, **kw), torch.randn(8, 21, 128, 128, **kw)
        with torch.no_grad():
            timed("argmax_4096x1024_dim1", lambda: x.argmax(1), x.numel(), "Gelem/s")
            timed("argmax_4096x1024_dim0", lambda: x.argmax(0), x.numel(), "Gelem/s")
            timed("argmax_8x21x128x128_dim1", lambda: pixels.argmax(1), pixels.numel(), "Gelem/s")
            timed("amax_4096x1024", lambda: x.amax(), x.numel(), "Gelem/s")

    if not a.only or a.only in "argmax":
        attempt("argmax", arg_reductions)

    def bandwidth():
        n = 1 << 26
        x, y = torch.randn(n, **kw), torch.randn(n, **kw)
        with torch.no_grad():
            timed("add_bandwidth_64M", lambda: x + y, 3.0 * 4 * n, "GB/s")
            timed("copy_bandwidth_64M", lambda: x.clone(), 2.0 * 4 * n, "GB/s")

    if not a.only or a.only in "add_bandwidth":
        attempt("add_bandwidth", bandwidth)

    def overhead():
        adds = 10000
        x = torch.randn(16, **kw).requires_grad_()

        def chain():
            y = x
            for _ in range(adds):
                y = y + x
            return y
        with torch.no_grad():
            timed_latency("overhead_add16_nograd", chain, adds)
        timed_latency("overhead_add16_autograd_fwd", chain, adds)
        timed_latency("overhead_add16_autograd_fwdbwd", lambda: chain().sum().backward(), adds)
        params = []
        for out, inp in [(32, 16), (32, 32), (1, 32)]:
            params.append((torch.randn(out, inp, **kw) * 0.1).requires_grad_())
            params.append(torch.zeros(out, **kw).requires_grad_())
        adam = torch.optim.Adam(params, lr=1e-3)  # PyTorch's default: the multi-tensor (foreach) step
        inp, target = torch.randn(16, 16, **kw), torch.randn(16, 1, **kw)
        steps = 100

        def train():
            for _ in range(steps):
                adam.zero_grad()
                h = F.relu(F.linear(inp, params[0], params[1]))
                h = F.relu(F.linear(h, params[2], params[3]))
                out = F.linear(h, params[4], params[5])
                ((out - target) ** 2).mean().backward()
                adam.step()
        timed_latency("overhead_mlp_adam_step", train, steps)

    if not a.only or a.only in "overhead":
        attempt("overhead", overhead)
    return 0


if __name__ == "__main__":
    sys.exit(main())
