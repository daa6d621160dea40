"""Writes the reference values the loss tests compare against, computed by PyTorch in float64.

Run with Debian's PyTorch (python3-torch, 1.13): /usr/bin/python3 scripts/make_loss_fixtures.py
It writes tests/fixtures/losses.json, read by tests/losses/ (values and gradcheck). Each case names a
loss of losses/losses.h and its options; its inputs, the upstream gradient (random, shaped like the
output) and the gradients of the float inputs are stored. torch.nn.functional gives cross_entropy,
nll_loss, binary_cross_entropy_with_logits, mse, l1 and smooth_l1; focal, Dice, Lovász-softmax (a
port of Berman et al.'s lovasz_softmax), OHEM and the gradient penalties are written below in torch.
The penalties use a small fixed MLP critic whose weights are stored; their gradients are those of
the critic's weights (a second derivative, through autograd.grad(create_graph=True)).
"""
import json
import os

import torch
import torch.nn.functional as F

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
OUT = os.path.join(ROOT, "tests", "fixtures", "losses.json")
DTYPES = {torch.float64: "float64", torch.int64: "int64"}
F64 = torch.float64

gen = torch.Generator().manual_seed(20240611)


def tensor_json(t):
    t = t.detach().cpu()
    return {"shape": list(t.shape), "dtype": DTYPES[t.dtype], "data": t.reshape(-1).tolist()}


def randn(*shape, scale=1.0):
    return torch.randn(shape, generator=gen, dtype=F64) * scale


def rand(*shape):
    return torch.rand(shape, generator=gen, dtype=F64)


def classes(shape, c):
    return torch.randint(0, c, shape, generator=gen)


def with_ignored(target, ignore, fraction=0.25):
    mask = torch.rand(target.shape, generator=gen) < fraction
    return target.masked_fill(mask, ignore)


def reduce(per, reduction):
    if reduction == "none":
        return per
    if reduction == "sum":
        return per.sum()
    return per.mean() if per.numel() > 0 else per.sum()


# --- Losses written here in torch ---------------------------------------------------------------------


def focal_loss(logits, target, gamma, alpha, ignore_index, reduction):
    valid = target != ignore_index
    clean = target.masked_fill(~valid, 0)
    log_pt = F.log_softmax(logits, 1).gather(1, clean.unsqueeze(1)).squeeze(1)
    per = -(1 - log_pt.exp()) ** gamma * log_pt
    if alpha is not None:
        per = per * alpha[clean]
    per = torch.where(valid, per, torch.zeros_like(per))
    if reduction == "mean":
        return per.sum() / valid.sum().clamp_min(1)
    return reduce(per, reduction)


def dice_loss(logits, target, smooth, ignore_index, reduction):
    c = logits.shape[1]
    valid = (target != ignore_index).unsqueeze(1)
    clean = target.masked_fill(target == ignore_index, 0)
    p = F.softmax(logits, 1) * valid
    onehot = F.one_hot(clean, c).movedim(-1, 1).to(logits.dtype) * valid
    dims = tuple(range(2, logits.dim()))
    intersection = (p * onehot).sum(dims)
    denominator = p.sum(dims) + onehot.sum(dims) + smooth
    per = 1 - ((2 * intersection + smooth) / denominator).mean(1)
    return reduce(per, reduction)


# Berman et al., "The Lovász-Softmax loss" (CVPR 2018), reference code lovasz_losses.py.
def lovasz_grad(gt_sorted):
    gts = gt_sorted.sum()
    intersection = gts - gt_sorted.cumsum(0)
    union = gts + (1 - gt_sorted).cumsum(0)
    jaccard = 1.0 - intersection / union
    if len(gt_sorted) > 1:
        jaccard[1:] = jaccard[1:] - jaccard[:-1]
    return jaccard


def lovasz_softmax_flat(probas, labels, only_present):
    if probas.numel() == 0:
        return probas.sum() * 0.0  # only ignored pixels
    losses = []
    for c in range(probas.shape[1]):
        fg = (labels == c).to(probas.dtype)
        if only_present and fg.sum() == 0:
            continue
        errors = (fg - probas[:, c]).abs()
        errors_sorted, perm = torch.sort(errors, 0, descending=True)
        losses.append(torch.dot(errors_sorted, lovasz_grad(fg[perm])))
    return sum(losses) / len(losses)


def lovasz_softmax(logits, target, only_present, ignore_index, reduction):
    n, c = logits.shape[:2]
    probas = F.softmax(logits, 1)
    per = []
    for i in range(n):
        p = probas[i].reshape(c, -1).t()
        labels = target[i].reshape(-1)
        keep = labels != ignore_index
        per.append(lovasz_softmax_flat(p[keep], labels[keep], only_present))
    return reduce(torch.stack(per), reduction)


# OhemCrossEntropy2d (PSPNet / OCNet), per image.
def ohem_cross_entropy(logits, target, threshold, min_kept, ignore_index, reduction):
    n, c = logits.shape[:2]
    log_probs = F.log_softmax(logits, 1).reshape(n, c, -1)
    labels_all = target.reshape(n, -1)
    per = []
    for i in range(n):
        labels = labels_all[i]
        valid = (labels != ignore_index).nonzero().flatten()
        ce = -log_probs[i, labels[valid], valid]
        if len(valid) > min_kept:
            q = (-ce).exp().detach()
            t = threshold
            if min_kept > 0:
                t = max(t, torch.sort(q).values[min_kept - 1].item())
            ce = ce[q <= t]
        per.append(ce.mean() if len(ce) > 0 else log_probs.sum() * 0.0)
    return reduce(torch.stack(per), reduction)


# --- Gradient penalties -------------------------------------------------------------------------------


def critic_weights():
    return {"w1": randn(5, 6, scale=0.7), "b1": randn(5, scale=0.3), "w2": randn(1, 5, scale=0.7),
            "b2": randn(1, scale=0.3)}


def critic(w, x):
    h = torch.tanh(F.linear(x.reshape(x.shape[0], -1), w["w1"], w["b1"]))
    return F.linear(h, w["w2"], w["b2"])


def critic_gradient(w, x):
    x = x.detach().requires_grad_()
    out = critic(w, x)
    (g,) = torch.autograd.grad(out, x, torch.ones_like(out), create_graph=True)
    return g.reshape(x.shape[0], -1)


def unit_norm_penalty(g, lam):
    return lam * ((g.norm(2, dim=1) - 1) ** 2).mean()


# --- Cases ----------------------------------------------------------------------------------------------


def case(name, loss, options, inputs, differentiable, fn):
    """Runs fn(**inputs) with gradients for the `differentiable` inputs and stores everything."""
    leaves = {k: (v.clone().requires_grad_() if k in differentiable else v) for k, v in inputs.items()}
    out = fn(**leaves)
    gy = randn(*out.shape)
    grads = torch.autograd.grad((out * gy).sum(), [leaves[k] for k in differentiable])
    return {
        "name": name,
        "loss": loss,
        "options": options,
        "inputs": {k: tensor_json(v) for k, v in inputs.items()},
        "output": tensor_json(out),
        "grad_output": tensor_json(gy),
        "grads": {k: tensor_json(g) for k, g in zip(differentiable, grads)},
    }


def cross_entropy_cases():
    out = []

    def ce(name, logits, target, weight=None, ignore_index=-100, smoothing=0.0, reduction="mean"):
        inputs = {"logits": logits, "target": target}
        if weight is not None:
            inputs["weight"] = weight
        opts = {"ignore_index": ignore_index, "label_smoothing": smoothing, "reduction": reduction}
        out.append(case(name, "cross_entropy", opts, inputs, ["logits"],
                        lambda logits, target, weight=None: F.cross_entropy(
                            logits, target, weight=weight, ignore_index=ignore_index, reduction=reduction,
                            label_smoothing=smoothing)))

    ce("ce_plain", randn(5, 4, scale=1.5), classes((5,), 4))
    ce("ce_weight", randn(5, 4, scale=1.5), classes((5,), 4), weight=rand(4) + 0.2)
    ce("ce_label_smoothing", randn(5, 4, scale=1.5), classes((5,), 4), smoothing=0.2)
    ce("ce_ignore_index", randn(6, 4, scale=1.5), torch.tensor([0, -100, 3, 1, -100, 2]))
    ce("ce_ignore_index_custom_sum", randn(6, 3), torch.tensor([0, 2, 1, 1, 2, 0]), ignore_index=1,
       reduction="sum")
    ce("ce_1d_spatial_weight_sum", randn(3, 4, 6), classes((3, 6), 4), weight=rand(4) + 0.2, reduction="sum")
    nchw = randn(2, 3, 4, 5, scale=1.5)
    nchw_target = with_ignored(classes((2, 4, 5), 3), 255)
    for reduction in ["none", "mean", "sum"]:
        ce(f"ce_nchw_{reduction}", nchw, nchw_target, ignore_index=255, reduction=reduction)
    weight = rand(3) + 0.2
    for reduction in ["none", "mean", "sum"]:
        ce(f"ce_nchw_weight_smoothing_ignore_{reduction}", nchw, nchw_target, weight=weight, ignore_index=255,
           smoothing=0.1, reduction=reduction)
    return out


def nll_cases():
    out = []

    def nll(name, log_probs, target, weight=None, ignore_index=-100, reduction="mean"):
        inputs = {"log_probs": log_probs, "target": target}
        if weight is not None:
            inputs["weight"] = weight
        opts = {"ignore_index": ignore_index, "label_smoothing": 0.0, "reduction": reduction}
        out.append(case(name, "nll_loss", opts, inputs, ["log_probs"],
                        lambda log_probs, target, weight=None: F.nll_loss(
                            log_probs, target, weight=weight, ignore_index=ignore_index, reduction=reduction)))

    nll("nll_plain", F.log_softmax(randn(5, 4), 1), classes((5,), 4))
    nchw_target = with_ignored(classes((2, 4, 5), 3), -100)
    nll("nll_nchw_weight_ignore_none", randn(2, 3, 4, 5), nchw_target, weight=rand(3) + 0.2, reduction="none")
    nll("nll_nchw_weight_ignore_mean", randn(2, 3, 4, 5), nchw_target, weight=rand(3) + 0.2)
    nll("nll_sum", randn(4, 3), classes((4,), 3), reduction="sum")
    return out


def focal_cases():
    out = []

    def focal(name, logits, target, gamma, alpha=None, ignore_index=-100, reduction="mean"):
        inputs = {"logits": logits, "target": target}
        if alpha is not None:
            inputs["alpha"] = alpha
        opts = {"gamma": gamma, "ignore_index": ignore_index, "reduction": reduction}
        out.append(case(name, "focal_loss", opts, inputs, ["logits"],
                        lambda logits, target, alpha=None: focal_loss(logits, target, gamma, alpha, ignore_index,
                                                                      reduction)))

    focal("focal_plain", randn(6, 4, scale=1.5), classes((6,), 4), 2.0)
    nchw_target = with_ignored(classes((2, 4, 5), 3), 255)
    focal("focal_nchw_alpha_ignore_none", randn(2, 3, 4, 5, scale=1.5), nchw_target, 1.5, alpha=rand(3) + 0.2,
          ignore_index=255, reduction="none")
    focal("focal_nchw_alpha_ignore_mean", randn(2, 3, 4, 5, scale=1.5), nchw_target, 2.0, alpha=rand(3) + 0.2,
          ignore_index=255)
    focal("focal_gamma0_sum", randn(5, 3), classes((5,), 3), 0.0, reduction="sum")
    return out


def dice_cases():
    out = []

    def dice(name, logits, target, smooth=1.0, ignore_index=-100, reduction="mean"):
        opts = {"smooth": smooth, "ignore_index": ignore_index, "reduction": reduction}
        out.append(case(name, "dice_loss", opts, {"logits": logits, "target": target}, ["logits"],
                        lambda logits, target: dice_loss(logits, target, smooth, ignore_index, reduction)))

    dice("dice_nchw_mean", randn(2, 3, 4, 5, scale=1.5), classes((2, 4, 5), 3))
    dice("dice_nchw_ignore_none", randn(2, 3, 4, 5, scale=1.5), with_ignored(classes((2, 4, 5), 3), 255),
         ignore_index=255, reduction="none")
    dice("dice_1d_smooth0_ignore_sum", randn(3, 4, 7), with_ignored(classes((3, 7), 4), -100), smooth=0.0,
         reduction="sum")
    return out


def lovasz_cases():
    out = []

    def lovasz(name, logits, target, only_present=True, ignore_index=-100, reduction="mean"):
        opts = {"only_present": only_present, "ignore_index": ignore_index, "reduction": reduction}
        out.append(case(name, "lovasz_softmax", opts, {"logits": logits, "target": target}, ["logits"],
                        lambda logits, target: lovasz_softmax(logits, target, only_present, ignore_index,
                                                              reduction)))

    lovasz("lovasz_nchw_mean", randn(2, 3, 4, 5, scale=1.5), classes((2, 4, 5), 3))
    lovasz("lovasz_nchw_ignore_none", randn(2, 3, 4, 5, scale=1.5), with_ignored(classes((2, 4, 5), 3), 255),
           ignore_index=255, reduction="none")
    # Image 0 lacks class 3, image 1 is entirely ignored, image 2 is a normal one.
    target = classes((3, 3, 4), 3)
    target[1] = -100
    target[2, 0, :] = 3
    lovasz("lovasz_all_classes_sum", randn(3, 4, 3, 4, scale=1.5), target, only_present=False, reduction="sum")
    lovasz("lovasz_present_missing_class_none", randn(3, 4, 3, 4, scale=1.5), target, reduction="none")
    return out


def ohem_cases():
    out = []
    counts = {}

    def ohem(name, logits, target, threshold, min_kept, ignore_index=-100, reduction="mean"):
        opts = {"threshold": threshold, "min_kept": min_kept, "ignore_index": ignore_index, "reduction": reduction}
        out.append(case(name, "ohem_cross_entropy", opts, {"logits": logits, "target": target}, ["logits"],
                        lambda logits, target: ohem_cross_entropy(logits, target, threshold, min_kept,
                                                                  ignore_index, reduction)))
        clean = target.masked_fill(target == ignore_index, 0)
        q = F.softmax(logits, 1).gather(1, clean.unsqueeze(1)).squeeze(1)
        counts[name] = [int(((q <= threshold) & (target != ignore_index))[i].sum()) for i in range(len(q))]

    # Confident logits, half of the targets equal to the prediction: some pixels are easy (q > 0.7).
    logits = randn(2, 3, 4, 5, scale=3.0)
    target = torch.where(torch.rand(2, 4, 5, generator=gen) < 0.5, logits.argmax(1), classes((2, 4, 5), 3))
    ohem("ohem_threshold_mean", logits, target, 0.7, 4)
    ohem("ohem_min_kept_raises_threshold_none", logits, target, 0.7, 15, reduction="none")
    ohem("ohem_keep_all_sum", logits, target, 0.7, 20, reduction="sum")
    ignored = with_ignored(target, 255)
    ohem("ohem_no_min_kept_ignore_mean", logits, ignored, 0.5, 0, ignore_index=255)
    ohem("ohem_min_kept_ignore_none", logits, ignored, 0.6, 12, ignore_index=255, reduction="none")
    return out, counts


def regression_cases():
    out = []
    for reduction in ["none", "mean", "sum"]:
        x, t = randn(3, 4), randn(3, 4)
        out.append(case(f"mse_{reduction}", "mse_loss", {"reduction": reduction}, {"input": x, "target": t},
                        ["input", "target"], lambda input, target: F.mse_loss(input, target, reduction=reduction)))
        x, t = randn(3, 4), randn(3, 4)
        out.append(case(f"l1_{reduction}", "l1_loss", {"reduction": reduction}, {"input": x, "target": t},
                        ["input", "target"], lambda input, target: F.l1_loss(input, target, reduction=reduction)))
    for beta, reduction in [(1.0, "mean"), (1.0, "none"), (0.5, "sum"), (0.5, "none"), (0.0, "mean")]:
        x, t = randn(3, 5, scale=1.2), randn(3, 5, scale=1.2)
        out.append(case(f"smooth_l1_beta{beta}_{reduction}", "smooth_l1_loss", {"beta": beta, "reduction": reduction},
                        {"input": x, "target": t}, ["input", "target"],
                        lambda input, target: F.smooth_l1_loss(input, target, beta=beta, reduction=reduction)))
    return out


def bce_cases():
    out = []

    def bce(name, logits, target, weight=None, pos_weight=None, reduction="mean"):
        inputs = {"logits": logits, "target": target}
        if weight is not None:
            inputs["weight"] = weight
        if pos_weight is not None:
            inputs["pos_weight"] = pos_weight
        out.append(case(name, "binary_cross_entropy_with_logits", {"reduction": reduction}, inputs,
                        ["logits", "target"],
                        lambda logits, target, weight=None, pos_weight=None: F.binary_cross_entropy_with_logits(
                            logits, target, weight=weight, pos_weight=pos_weight, reduction=reduction)))

    bce("bce_plain", randn(4, 3, scale=2.0), rand(4, 3))
    large = randn(4, 3, scale=2.0)
    large[0, 0], large[1, 1], large[2, 2] = 40.0, -45.0, 0.0
    bce("bce_large_logits_none", large, (rand(4, 3) < 0.5).to(F64), reduction="none")
    bce("bce_weight_sum", randn(4, 3, scale=2.0), rand(4, 3), weight=rand(4, 1) + 0.2, reduction="sum")
    bce("bce_pos_weight_mean", randn(2, 3, 3, scale=2.0), rand(2, 3, 3), pos_weight=rand(3) * 3)
    bce("bce_weight_pos_weight_none", randn(4, 3, scale=2.0), rand(4, 3), weight=rand(3) + 0.2,
        pos_weight=rand(3) * 3, reduction="none")
    return out


def gan_cases():
    out = [
        case("wasserstein_critic", "wasserstein_critic_loss", {}, {"d_real": randn(5), "d_fake": randn(3, 1)},
             ["d_real", "d_fake"], lambda d_real, d_fake: d_fake.mean() - d_real.mean()),
        case("wasserstein_generator", "wasserstein_generator_loss", {}, {"d_fake": randn(4, 1)}, ["d_fake"],
             lambda d_fake: -d_fake.mean()),
    ]
    names = ["w1", "b1", "w2", "b2"]

    def penalty(name, loss, options, inputs, fn):
        w = {k: v.requires_grad_() for k, v in critic_weights().items()}
        value = fn(w, **inputs)
        # The output bias does not change ∇D(x): its gradient is zero (None in torch).
        grads = torch.autograd.grad(value, [w[k] for k in names], allow_unused=True)
        grads = [torch.zeros_like(w[k]) if g is None else g for k, g in zip(names, grads)]
        out.append({
            "name": name,
            "loss": loss,
            "options": options,
            "inputs": {k: tensor_json(v) for k, v in inputs.items()},
            "critic": [[k, tensor_json(w[k])] for k in names],
            "output": tensor_json(value),
            "critic_grads": [[k, tensor_json(g)] for k, g in zip(names, grads)],
        })

    real, fake = randn(4, 1, 2, 3), randn(4, 1, 2, 3)
    penalty("wgan_gp", "wgan_gp_penalty", {"lambda": 10.0}, {"real": real, "fake": fake, "eps": rand(4, 1, 1, 1)},
            lambda w, real, fake, eps: unit_norm_penalty(critic_gradient(w, eps * real + (1 - eps) * fake), 10.0))
    penalty("dragan", "dragan_penalty", {"lambda": 5.0, "c": 0.5}, {"real": real, "noise": rand(4, 1, 2, 3)},
            lambda w, real, noise: unit_norm_penalty(critic_gradient(w, real + 0.5 * real.std() * noise), 5.0))
    penalty("r1", "r1_penalty", {"gamma": 3.0}, {"real": real},
            lambda w, real: 1.5 * critic_gradient(w, real).pow(2).sum(1).mean())
    return out


def main():
    ohem, counts = ohem_cases()
    cases = (cross_entropy_cases() + nll_cases() + focal_cases() + dice_cases() + lovasz_cases() + ohem
             + regression_cases() + bce_cases() + gan_cases())
    with open(OUT, "w") as f:
        json.dump({"torch_version": torch.__version__, "cases": cases}, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(cases)} cases to {os.path.relpath(OUT, ROOT)}")
    print("OHEM pixels at or below the threshold per image:", counts)


if __name__ == "__main__":
    main()
