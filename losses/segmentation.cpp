// Per-image segmentation losses: soft Dice, Lovász-softmax, OHEM cross-entropy. Each is a loss per
// image averaged over images (its parts: the sum over images and their count, Note [Losses across
// devices] in losses.h). Lovász-softmax and OHEM make a discrete choice per image (a sort, a
// selection) on the host from values read back without gradient; the choice is a constant of the
// graph and the loss is engine ops on top of it, so it is differentiable to any order.
#include <algorithm>
#include <cmath>
#include <vector>

#include "evenflow/losses/common_internal.h"

namespace evenflow::losses {

using detail::masked;
using detail::nonzero;

namespace {

// Logits [N, C, d1, ...] seen as [N, C, P], P pixels per image.
int64_t pixels_per_image(const Tensor& logits) {
  return logits.numel() / (logits.size(0) * logits.size(1));
}

// Indices of image n's non-ignored pixels, from the host copy of the target [N, P].
std::vector<int64_t> valid_pixels(const std::vector<int64_t>& target, int64_t n, int64_t pixels, int64_t ignore_index) {
  std::vector<int64_t> out;
  for (int64_t p = 0; p < pixels; ++p)
    if (target[static_cast<size_t>(n * pixels + p)] != ignore_index) out.push_back(p);
  return out;
}

}  // namespace

namespace detail {

Unreduced dice(const Tensor& logits, const Tensor& target, const DiceOptions& o) {
  const detail::ClassTarget t = detail::class_target("dice_loss", logits, target, o.ignore_index, 3);
  EF_CHECK(o.smooth >= 0, "dice_loss: smooth must be non-negative, got ", o.smooth);
  const Shape dims = detail::spatial_dims(logits);
  const Tensor valid = unsqueeze(t.valid, 1);  // [N, 1, d1, ...]
  const Tensor p = masked(softmax(logits, 1), valid);
  const Tensor onehot = detail::one_hot(t.clean, logits.size(1), logits.dtype()) * valid;
  const Tensor intersection = sum(p * onehot, dims);  // [N, C]
  // 0 only when smooth = 0 and the image has no valid pixel, which the mask below zeroes anyway.
  const Tensor denominator = sum(p, dims) + sum(onehot, dims) + o.smooth;
  const Tensor dice = (intersection * 2.0 + o.smooth) / nonzero(denominator);
  const Tensor has_valid =
      gt(squeeze(sum(valid, dims), 1), zeros({}, {.dtype = logits.dtype(), .device = logits.device()}));
  return {masked(1.0 - mean(dice, {1}), has_valid), {}};
}

// Note [Lovász-softmax as a weighted sum]
// Berman et al. sort the errors e of a class in decreasing order and take dot(e_sorted, g), where
// g is the gradient of the Lovász extension of the Jaccard loss at the sorted ground truth
// (lovasz_grad). That dot product equals Σ_j e_j·W_j with W_j = g at the sorted position of pixel j,
// so the loss is sum(errors·W) with a constant W built on the host: one elementwise product for all
// images and classes instead of a gather per class, with the same derivatives (no tie among the
// errors; at a tie the Lovász extension has a kink and any order gives a valid subgradient).
Unreduced lovasz(const Tensor& logits, const Tensor& target, const LovaszOptions& o) {
  const detail::ClassTarget t = detail::class_target("lovasz_softmax", logits, target, o.ignore_index);
  const int64_t n_images = logits.size(0), classes = logits.size(1), pixels = pixels_per_image(logits);
  const Tensor probs = reshape(softmax(logits, 1), {n_images, classes, pixels});
  const Tensor onehot = reshape(detail::one_hot(t.clean, classes, logits.dtype()), {n_images, classes, pixels});
  const Tensor errors = abs(onehot - probs);  // [N, C, P]

  std::vector<double> host_errors;
  std::vector<int64_t> host_target;
  {
    NoGradGuard no_grad;
    host_errors = errors.detach().to_vector();
    host_target = target.to_int_vector();
  }
  std::vector<double> weights(host_errors.size(), 0.0);
  for (int64_t n = 0; n < n_images; ++n) {
    const std::vector<int64_t> valid = valid_pixels(host_target, n, pixels, o.ignore_index);
    std::vector<int64_t> present(static_cast<size_t>(classes), 0);
    for (int64_t p : valid) ++present[static_cast<size_t>(host_target[static_cast<size_t>(n * pixels + p)])];
    std::vector<int64_t> used;
    for (int64_t c = 0; c < classes; ++c)
      if (!valid.empty() && (!o.only_present || present[static_cast<size_t>(c)] > 0)) used.push_back(c);
    for (int64_t c : used) {
      const size_t base = static_cast<size_t>((n * classes + c) * pixels);
      std::vector<int64_t> order = valid;
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
        return host_errors[base + static_cast<size_t>(a)] > host_errors[base + static_cast<size_t>(b)];
      });
      // lovasz_grad: Jaccard loss of the first i+1 sorted pixels, differenced.
      const auto fg_total = static_cast<double>(present[static_cast<size_t>(c)]);
      double fg_seen = 0, bg_seen = 0, previous = 0;
      for (int64_t p : order) {
        const bool fg = host_target[static_cast<size_t>(n * pixels + p)] == c;
        fg_seen += fg ? 1 : 0;
        bg_seen += fg ? 0 : 1;
        const double jaccard = 1.0 - (fg_total - fg_seen) / (fg_total + bg_seen);
        weights[base + static_cast<size_t>(p)] = (jaccard - previous) / static_cast<double>(used.size());
        previous = jaccard;
      }
    }
  }
  const Tensor w = from_vector(weights, errors.shape(), {.dtype = logits.dtype(), .device = logits.device()});
  return {sum(errors * w, {1, 2}), {}};
}

// The selection of OhemCrossEntropy2d (PSPNet, OCNet), per image: with q the softmax probability of
// the target class at the image's V valid pixels, keep all of them if V ≤ min_kept; otherwise keep
// q ≤ threshold, raising the threshold to the min_kept-th smallest q when fewer would be kept.
Unreduced ohem(const Tensor& logits, const Tensor& target, const OhemOptions& o) {
  const detail::ClassTarget t = detail::class_target("ohem_cross_entropy", logits, target, o.ignore_index);
  EF_CHECK(o.min_kept >= 0, "ohem_cross_entropy: min_kept must be non-negative, got ", o.min_kept);
  const int64_t n_images = logits.size(0), pixels = pixels_per_image(logits);
  const Tensor ce =
      reshape(neg(squeeze(gather(log_softmax(logits, 1), 1, unsqueeze(t.clean, 1)), 1)), {n_images, pixels});

  std::vector<double> host_ce;
  std::vector<int64_t> host_target;
  {
    NoGradGuard no_grad;
    host_ce = ce.detach().to_vector();
    host_target = target.to_int_vector();
  }
  std::vector<double> keep(host_ce.size(), 0.0), kept_count(static_cast<size_t>(n_images), 1.0);
  for (int64_t n = 0; n < n_images; ++n) {
    const std::vector<int64_t> valid = valid_pixels(host_target, n, pixels, o.ignore_index);
    auto q = [&](int64_t p) { return std::exp(-host_ce[static_cast<size_t>(n * pixels + p)]); };
    double threshold = o.threshold;
    const bool keep_all = static_cast<int64_t>(valid.size()) <= o.min_kept;
    if (!keep_all && o.min_kept > 0) {
      std::vector<double> qs;
      for (int64_t p : valid) qs.push_back(q(p));
      std::nth_element(qs.begin(), qs.begin() + (o.min_kept - 1), qs.end());
      threshold = std::max(threshold, qs[static_cast<size_t>(o.min_kept - 1)]);
    }
    int64_t count = 0;
    for (int64_t p : valid) {
      if (keep_all || q(p) <= threshold) {
        keep[static_cast<size_t>(n * pixels + p)] = 1.0;
        ++count;
      }
    }
    if (count > 0) kept_count[static_cast<size_t>(n)] = static_cast<double>(count);
  }
  const TensorOptions opts{.dtype = logits.dtype(), .device = logits.device()};
  const Tensor kept = from_vector(keep, {n_images, pixels}, opts);
  return {sum(masked(ce, kept), {1}) / from_vector(kept_count, {n_images}, opts), {}};
}

}  // namespace detail

Tensor dice_loss(const Tensor& logits, const Tensor& target, const DiceOptions& o) {
  return detail::reduced(detail::dice(logits, target, o), o.reduction);
}
Tensor lovasz_softmax(const Tensor& logits, const Tensor& target, const LovaszOptions& o) {
  return detail::reduced(detail::lovasz(logits, target, o), o.reduction);
}
Tensor ohem_cross_entropy(const Tensor& logits, const Tensor& target, const OhemOptions& o) {
  return detail::reduced(detail::ohem(logits, target, o), o.reduction);
}

Tensor DiceLoss::operator()(const Tensor& logits, const Tensor& target) const {
  return dice_loss(logits, target, options);
}
LossParts DiceLoss::parts(const Tensor& logits, const Tensor& target) const {
  return detail::parts_of(detail::dice(logits, target, options));
}
Tensor LovaszSoftmaxLoss::operator()(const Tensor& logits, const Tensor& target) const {
  return lovasz_softmax(logits, target, options);
}
LossParts LovaszSoftmaxLoss::parts(const Tensor& logits, const Tensor& target) const {
  return detail::parts_of(detail::lovasz(logits, target, options));
}
Tensor OhemCrossEntropyLoss::operator()(const Tensor& logits, const Tensor& target) const {
  return ohem_cross_entropy(logits, target, options);
}
LossParts OhemCrossEntropyLoss::parts(const Tensor& logits, const Tensor& target) const {
  return detail::parts_of(detail::ohem(logits, target, options));
}

}  // namespace evenflow::losses
