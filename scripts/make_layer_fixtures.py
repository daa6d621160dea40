"""Writes the reference values the layer and optimizer tests compare against, computed by PyTorch.

Run with Debian's PyTorch (python3-torch, 1.13): /usr/bin/python3 scripts/make_layer_fixtures.py
It writes tests/fixtures/layers.json and tests/fixtures/optim.json. Each layer case names a module
that tests/layers/test_layer_values.cpp builds the same way; its weights, buffers, input and the
upstream gradient are random here and stored, so the C++ side loads them with load_state_dict and
compares the output, the gradients of the input and of every parameter, the buffers after the
forward pass, and for BatchNorm the output in eval mode afterwards. The optimizer cases run a few
steps on a tiny fixed function; the schedule cases record the learning rate after every step.
"""
import json
import math
import os
import warnings

import torch
import torch.nn as nn

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT_DIR = os.path.join(ROOT, "tests", "fixtures")
DTYPES = {torch.float32: "float32", torch.float64: "float64", torch.int64: "int64"}


def tensor_json(t):
    t = t.detach().cpu()
    return {"shape": list(t.shape), "dtype": DTYPES[t.dtype], "data": t.reshape(-1).tolist()}


def named_json(pairs):
    return [[name, tensor_json(t)] for name, t in pairs]


# --- Layers -----------------------------------------------------------------------------------------

# name -> (module factory, input shape, dtype); the C++ test builds the same module for each name.
LAYER_CASES = {
    "linear": (lambda: nn.Linear(4, 3), [2, 4], torch.float64),
    "linear_nobias_3d": (lambda: nn.Linear(4, 3, bias=False), [2, 2, 4], torch.float64),
    "linear_float32": (lambda: nn.Linear(5, 2), [3, 5], torch.float32),
    "conv2d": (lambda: nn.Conv2d(2, 3, 3, padding=1), [2, 2, 5, 5], torch.float64),
    "conv2d_strided_grouped": (
        lambda: nn.Conv2d(4, 4, (3, 2), stride=(2, 1), padding=(1, 0), dilation=(1, 2), groups=2, bias=False),
        [1, 4, 6, 7], torch.float64),
    "conv2d_float32": (lambda: nn.Conv2d(3, 2, 2, stride=2), [1, 3, 4, 4], torch.float32),
    "conv_transpose2d": (lambda: nn.ConvTranspose2d(2, 3, 3, stride=2, padding=1, output_padding=1),
                         [1, 2, 3, 3], torch.float64),
    "conv_transpose2d_grouped": (
        lambda: nn.ConvTranspose2d(4, 2, (2, 3), stride=(1, 2), padding=(0, 1), output_padding=(0, 1),
                                   dilation=(2, 1), groups=2),
        [2, 4, 3, 3], torch.float64),
    "batchnorm1d": (lambda: nn.BatchNorm1d(3), [4, 3], torch.float64),
    "batchnorm1d_3d_cumulative": (lambda: nn.BatchNorm1d(2, momentum=None, affine=False), [3, 2, 4],
                                  torch.float64),
    "batchnorm2d": (lambda: nn.BatchNorm2d(3, momentum=0.3, eps=1e-3), [2, 3, 3, 3], torch.float64),
    "batchnorm2d_no_running_stats": (lambda: nn.BatchNorm2d(2, track_running_stats=False), [2, 2, 2, 3],
                                     torch.float64),
    "batchnorm2d_float32": (lambda: nn.BatchNorm2d(2), [3, 2, 2, 2], torch.float32),
    "layernorm": (lambda: nn.LayerNorm([3, 4]), [2, 3, 4], torch.float64),
    "layernorm_noaffine": (lambda: nn.LayerNorm(5, eps=1e-3, elementwise_affine=False), [3, 5], torch.float64),
    "groupnorm": (lambda: nn.GroupNorm(2, 4), [2, 4, 3, 3], torch.float64),
    "groupnorm_noaffine_3d": (lambda: nn.GroupNorm(3, 6, eps=1e-3, affine=False), [2, 6, 5], torch.float64),
    "relu": (lambda: nn.ReLU(), [3, 4], torch.float64),
    "leaky_relu": (lambda: nn.LeakyReLU(0.2), [3, 4], torch.float64),
    "elu": (lambda: nn.ELU(alpha=0.5), [3, 4], torch.float64),
    "sigmoid": (lambda: nn.Sigmoid(), [3, 4], torch.float64),
    "tanh": (lambda: nn.Tanh(), [3, 4], torch.float64),
    "softplus": (lambda: nn.Softplus(beta=2.0, threshold=1.5), [3, 4], torch.float64),
    "maxpool2d": (lambda: nn.MaxPool2d(2), [1, 2, 4, 5], torch.float64),
    "maxpool2d_padded_ceil": (lambda: nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True), [1, 1, 5, 6],
                              torch.float64),
    "maxpool2d_dilated": (lambda: nn.MaxPool2d(2, stride=1, dilation=2), [1, 1, 5, 5], torch.float64),
    "avgpool2d": (lambda: nn.AvgPool2d(2), [1, 2, 4, 4], torch.float64),
    "avgpool2d_padded_ceil": (
        lambda: nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True, count_include_pad=False), [1, 2, 5, 6],
        torch.float64),
    "avgpool2d_ceil_count_pad": (lambda: nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True), [1, 2, 6, 6],
                                 torch.float64),
    "adaptive_avg_pool2d": (lambda: nn.AdaptiveAvgPool2d((2, 3)), [1, 2, 5, 7], torch.float64),
    "adaptive_avg_pool2d_global": (lambda: nn.AdaptiveAvgPool2d(1), [2, 3, 3, 2], torch.float64),
    "upsample_nearest_size": (lambda: nn.Upsample(size=(5, 7), mode="nearest"), [1, 2, 3, 4], torch.float64),
    "upsample_nearest_scale": (lambda: nn.Upsample(scale_factor=2, mode="nearest"), [1, 1, 2, 3], torch.float64),
    "upsample_bilinear_align_corners": (lambda: nn.Upsample(size=(5, 6), mode="bilinear", align_corners=True),
                                        [1, 1, 3, 4], torch.float64),
    "upsample_bilinear_scale": (lambda: nn.Upsample(scale_factor=(2, 3), mode="bilinear", align_corners=False),
                                [1, 2, 2, 3], torch.float64),
    "flatten": (lambda: nn.Flatten(), [2, 3, 2, 2], torch.float64),
    "flatten_range": (lambda: nn.Flatten(0, 1), [2, 3, 2], torch.float64),
    "sequential_cnn": (
        lambda: nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Linear(16, 3)),
        [2, 1, 4, 4], torch.float64),
}


def randomize(module, gen):
    """Random parameters and buffers; running variances positive, step counters left as they are."""
    with torch.no_grad():
        for name, t in module.state_dict().items():
            if t.dtype == torch.int64:
                continue
            if name.endswith("running_var"):
                t.copy_(torch.rand(t.shape, generator=gen, dtype=torch.float64) + 0.5)
            else:
                t.copy_(torch.randn(t.shape, generator=gen, dtype=torch.float64) * 0.5)


def layer_case(name, factory, shape, dtype, gen):
    module = factory().to(dtype)
    randomize(module, gen)
    if name == "batchnorm1d_3d_cumulative":
        module.num_batches_tracked.fill_(3)  # cumulative average: factor 1 / (3 + 1)
    state = [(k, v.clone()) for k, v in module.state_dict().items()]
    x = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
    module.train()
    y = module(x)
    gy = torch.randn(y.shape, generator=gen, dtype=torch.float64).to(dtype)
    (y * gy).sum().backward()
    case = {
        "name": name,
        "dtype": DTYPES[dtype],
        "repr": repr(module),
        "state": named_json(state),
        "input": tensor_json(x),
        "output": tensor_json(y),
        "grad_output": tensor_json(gy),
        "grad_input": tensor_json(x.grad),
        "grads": named_json([(k, p.grad) for k, p in module.named_parameters()]),
        "buffers_after": named_json(module.named_buffers()),
    }
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules()):
        module.eval()
        with torch.no_grad():
            case["eval_output"] = tensor_json(module(x))
    return case


# --- Optimizers -------------------------------------------------------------------------------------

OPTIM_CASES = {
    "sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
    "sgd_momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
    "sgd_momentum_dampening": lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, dampening=0.3),
    "sgd_nesterov": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
    "sgd_weight_decay": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.5, weight_decay=0.01),
    "adam": lambda ps: torch.optim.Adam(ps, lr=0.01),
    "adam_betas_weight_decay": lambda ps: torch.optim.Adam(ps, lr=0.02, betas=(0.0, 0.9), eps=1e-6,
                                                           weight_decay=0.1),
    "adam_amsgrad": lambda ps: torch.optim.Adam(ps, lr=0.05, amsgrad=True),
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.1),
    "adamw_amsgrad": lambda ps: torch.optim.AdamW(ps, lr=0.03, betas=(0.5, 0.99), weight_decay=0.5, amsgrad=True),
}
OPTIM_STEPS = 6
SKIP_Q_STEP = 2  # on this step q gets no gradient: PyTorch skips it (and its step count)


def optim_loss(p, q, a, t, use_q):
    """sum(a·(p - t)²) + ½·sum((q² - 1)²); tests/optim/test_optim.cpp computes the same."""
    loss = (a * (p - t) ** 2).sum()
    if use_q:
        loss = loss + 0.5 * ((q * q - 1) ** 2).sum()
    return loss


def optim_case(name, factory, gen):
    p = torch.randn(2, 3, generator=gen, dtype=torch.float64).requires_grad_()
    q = torch.randn(4, generator=gen, dtype=torch.float64).requires_grad_()
    a = torch.rand(2, 3, generator=gen, dtype=torch.float64) + 0.5
    t = torch.randn(2, 3, generator=gen, dtype=torch.float64)
    case = {"name": name, "p": tensor_json(p), "q": tensor_json(q), "a": tensor_json(a), "t": tensor_json(t),
            "skip_q_step": SKIP_Q_STEP, "steps": []}
    opt = factory([p, q])
    for step in range(OPTIM_STEPS):
        opt.zero_grad(set_to_none=True)
        optim_loss(p, q, a, t, step != SKIP_Q_STEP).backward()
        opt.step()
        case["steps"].append({"p": tensor_json(p), "q": tensor_json(q)})
    return case


def clip_cases(gen):
    cases = []
    for max_norm, norm_type in [(1.0, 2.0), (100.0, 2.0), (0.5, math.inf), (2.0, 1.0)]:
        g1 = torch.randn(3, 4, generator=gen, dtype=torch.float64)
        g2 = torch.randn(5, generator=gen, dtype=torch.float64)
        ps = [torch.zeros_like(g1, requires_grad=True), torch.zeros_like(g2, requires_grad=True)]
        ps[0].grad, ps[1].grad = g1.clone(), g2.clone()
        total = torch.nn.utils.clip_grad_norm_(ps, max_norm, norm_type)
        cases.append({"max_norm": max_norm, "norm_type": "inf" if math.isinf(norm_type) else norm_type,
                      "grads": [tensor_json(g1), tensor_json(g2)], "total_norm": total.item(),
                      "clipped": [tensor_json(ps[0].grad), tensor_json(ps[1].grad)]})
    return cases


SCHEDULE_CASES = {
    "step": (lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=3, gamma=0.5), 10),
    "cosine": (lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=5, eta_min=0.01), 12),
    "linear_warmup": (lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.1, total_iters=4), 8),
    "warmup_cosine": (lambda o: torch.optim.lr_scheduler.SequentialLR(
        o, [torch.optim.lr_scheduler.LinearLR(o, start_factor=0.1, total_iters=3),
            torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=7, eta_min=0.001)], milestones=[3]), 12),
}


def schedule_case(name, factory, steps):
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.1)
    sched = factory(opt)
    lrs = [opt.param_groups[0]["lr"]]
    for _ in range(steps):
        opt.step()
        sched.step()
        lrs.append(opt.param_groups[0]["lr"])
    return {"name": name, "base_lr": 0.1, "lrs": lrs}


def write(name, obj):
    path = os.path.join(OUT_DIR, name)
    with open(path, "w") as f:
        json.dump(obj, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {os.path.relpath(path, ROOT)} ({os.path.getsize(path)} bytes)")


def main():
    # SequentialLR steps its schedules with an explicit epoch internally, which PyTorch 1.13 warns about.
    warnings.filterwarnings("ignore", message="The epoch parameter")
    os.makedirs(OUT_DIR, exist_ok=True)
    gen = torch.Generator().manual_seed(1234)
    layers = [layer_case(name, *spec, gen) for name, spec in LAYER_CASES.items()]
    write("layers.json", {"torch_version": torch.__version__, "cases": layers})
    optim = {
        "torch_version": torch.__version__,
        "optimizers": [optim_case(name, factory, gen) for name, factory in OPTIM_CASES.items()],
        "clip_grad_norm": clip_cases(gen),
        "schedules": [schedule_case(name, *spec) for name, spec in SCHEDULE_CASES.items()],
    }
    write("optim.json", optim)


if __name__ == "__main__":
    main()
