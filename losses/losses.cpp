// Classification losses (cross-entropy, NLL, focal), regression and binary losses, and the checks
// and masks every loss shares (losses/common_internal.h). Dice, Lovász-softmax and OHEM are in
// segmentation.cpp, the Wasserstein losses and gradient penalties in gan.cpp.
#include <cmath>
#include <string>

#include "evenflow/losses/common_internal.h"

namespace evenflow::losses {

namespace detail {

namespace {

// A fill, not a copy from the host: a recorded step may hold it (Note [A step that can be replayed]).
Tensor index_scalar(int64_t v, const Device& d) {
  return scalar_tensor(static_cast<double>(v), {.dtype = kInt64, .device = d});
}

// Targets are data, so a class out of range is the caller's mistake (an ef::Error here, or on a GPU
// at its next synchronization), not an invalid index deep inside gather.
void check_class_range(const char* loss, const Tensor& target, int64_t classes, int64_t ignore_index) {
  check_index_range(target, classes, ignore_index, [loss = std::string(loss), classes, ignore_index](int64_t bad) {
    return evenflow::detail::str_cat(
        loss, ": target holds class ", bad, ", outside [0, ", classes, ") for logits with ", classes, " classes",
        ignore_index == kNoIgnore ? std::string(" (no ignore_index)")
                                  : evenflow::detail::str_cat(" (ignore_index ", ignore_index, ")"));
  });
}

}  // namespace

ClassTarget class_target(const char* loss, const Tensor& target, int64_t classes, int64_t ignore_index,
                         DType mask_dtype) {
  EF_CHECK(target.defined(), loss, ": target is undefined");
  EF_CHECK(target.dtype() == kInt64, loss, ": target must hold int64 class indices, got ", dtype_name(target.dtype()));
  check_class_range(loss, target, classes, ignore_index);
  const Tensor valid_int = ne(target, index_scalar(ignore_index, target.device()));
  const Tensor clean = where(valid_int, target, index_scalar(0, target.device()));
  return {to_dtype(valid_int, mask_dtype), clean};
}

ClassTarget class_target(const char* loss, const Tensor& logits, const Tensor& target, int64_t ignore_index,
                         int64_t min_dim) {
  EF_CHECK(logits.defined(), loss, ": logits are undefined");
  EF_CHECK(is_floating(logits.dtype()), loss, ": logits must be float32 or float64, got ", dtype_name(logits.dtype()));
  EF_CHECK(logits.dim() >= min_dim, loss, ": logits must be ",
           min_dim == 2 ? "[N, C] or [N, C, d1, ...]" : "[N, C, d1, ...]", ", got ", shape_str(logits.shape()));
  EF_CHECK(target.defined(), loss, ": target is undefined");
  EF_CHECK(target.dtype() == kInt64, loss, ": target must hold int64 class indices, got ", dtype_name(target.dtype()));
  EF_CHECK(target.device() == logits.device(), loss, ": target is on ", target.device().str(), " but logits are on ",
           logits.device().str());
  Shape expected = logits.shape();
  expected.erase(expected.begin() + 1);
  EF_CHECK(target.shape() == expected, loss, ": target has shape ", shape_str(target.shape()), ", expected ",
           shape_str(expected), " for logits ", shape_str(logits.shape()));
  return class_target(loss, target, logits.size(1), ignore_index, logits.dtype());
}

void check_class_weight(const char* loss, const char* what, const Tensor& weight, const Tensor& logits) {
  if (!weight.defined()) return;
  EF_CHECK(weight.dim() == 1 && weight.size(0) == logits.size(1), loss, ": ", what, " has shape ",
           shape_str(weight.shape()), ", expected [", logits.size(1), "] (one per class)");
  EF_CHECK(weight.dtype() == logits.dtype(), loss, ": ", what, " is ", dtype_name(weight.dtype()), " but logits are ",
           dtype_name(logits.dtype()));
  EF_CHECK(weight.device() == logits.device(), loss, ": ", what, " is on ", weight.device().str(),
           " but logits are on ", logits.device().str());
}

void check_same_float(const char* loss, const Tensor& input, const Tensor& target, const char* what_input,
                      const char* what_target) {
  EF_CHECK(input.defined() && target.defined(), loss, ": ", input.defined() ? what_target : what_input,
           " is undefined");
  EF_CHECK(is_floating(input.dtype()), loss, ": ", what_input, " must be float32 or float64, got ",
           dtype_name(input.dtype()));
  EF_CHECK(target.dtype() == input.dtype(), loss, ": ", what_target, " is ", dtype_name(target.dtype()), " but ",
           what_input, " is ", dtype_name(input.dtype()));
  EF_CHECK(target.device() == input.device(), loss, ": ", what_target, " is on ", target.device().str(), " but ",
           what_input, " is on ", input.device().str());
  EF_CHECK(target.shape() == input.shape(), loss, ": ", what_target, " has shape ", shape_str(target.shape()), " but ",
           what_input, " has shape ", shape_str(input.shape()));
}

Tensor one_hot(const Tensor& clean, int64_t classes, DType dtype) {
  Shape class_shape(static_cast<size_t>(clean.dim() + 1), 1);
  class_shape[1] = classes;
  const Tensor ids =
      reshape(arange(0, static_cast<double>(classes), 1, {.dtype = kInt64, .device = clean.device()}), class_shape);
  return to_dtype(eq(unsqueeze(clean, 1), ids), dtype);
}

Tensor masked(const Tensor& x, const Tensor& mask) {
  return where(mask, x, zeros({}, {.dtype = x.dtype(), .device = x.device()}));
}

Tensor nonzero(const Tensor& d) {
  return d + eq(d, zeros({}, {.dtype = d.dtype(), .device = d.device()}));
}

Shape spatial_dims(const Tensor& logits) {
  Shape dims;
  for (int64_t i = 2; i < logits.dim(); ++i) dims.push_back(i);
  return dims;
}

}  // namespace detail

using detail::masked;
using detail::nonzero;

namespace {

// [C] -> [1, C, 1, ...], to broadcast against [N, C, d1, ...].
Tensor per_class_view(const Tensor& w, int64_t ndim) {
  Shape s(static_cast<size_t>(ndim), 1);
  s[1] = w.size(0);
  return reshape(w, s);
}

// w[clean], shaped like clean.
Tensor take_class(const Tensor& w, const Tensor& clean) {
  return reshape(index_select(w, 0, reshape(clean, {-1})), clean.shape());
}

// log p[target] per element, [N, d1, ...].
Tensor pick_target(const Tensor& log_probs, const Tensor& clean) {
  return squeeze(gather(log_probs, 1, unsqueeze(clean, 1)), 1);
}

// The nll_loss of PyTorch on log_softmax(input) (cross_entropy) or on input itself (nll_loss), and
// cross_entropy's label smoothing on top of it (torch's cross_entropy_loss_label_smoothing): per
// element
//   valid · [(1-ε)·w[t]·(-log p_t) + ε/C · Σ_c w[c]·(-log p_c)],
// and Mean divides the sum by Σ valid·w[t], the same divisor for both terms.
}  // namespace

namespace detail {

Unreduced weighted_nll(const char* loss, const Tensor& input, bool take_log_softmax, const Tensor& target,
                       const CrossEntropyOptions& o, double smoothing) {
  const detail::ClassTarget t = detail::class_target(loss, input, target, o.ignore_index);
  detail::check_class_weight(loss, "weight", o.weight, input);
  EF_CHECK(smoothing >= 0 && smoothing <= 1, loss, ": label_smoothing must be in [0, 1], got ", smoothing);
  const Tensor log_probs = take_log_softmax ? log_softmax(input, 1) : input;
  const int64_t classes = input.size(1);
  const Tensor weight_t = o.weight.defined() ? take_class(o.weight, t.clean) : Tensor();
  Tensor per = neg(pick_target(log_probs, t.clean));
  if (weight_t.defined()) per = per * weight_t;
  if (smoothing > 0) {
    const Tensor all = o.weight.defined() ? log_probs * per_class_view(o.weight, log_probs.dim()) : log_probs;
    per = per * (1.0 - smoothing) - sum(all, {1}) * (smoothing / static_cast<double>(classes));
  }
  return {masked(per, t.valid), weight_t.defined() ? sum(masked(weight_t, t.valid)) : sum(t.valid)};
}

Unreduced focal(const Tensor& logits, const Tensor& target, const FocalOptions& o) {
  const detail::ClassTarget t = class_target("focal_loss", logits, target, o.ignore_index);
  check_class_weight("focal_loss", "alpha", o.alpha, logits);
  EF_CHECK(o.gamma >= 0, "focal_loss: gamma must be non-negative, got ", o.gamma);
  const Tensor log_pt = pick_target(log_softmax(logits, 1), t.clean);
  Tensor per = neg(log_pt);
  // Note [Focal loss at saturated pixels]
  // Where p_t rounds to 1 (a logit gap of ~17 in float32, ~37 in float64), u = 1 - p_t is exactly
  // 0, and pow(u, γ)'s derivative γ·u^(γ-1) is infinite for γ < 1 (its second derivative for γ < 2):
  // times the zero derivative of u, NaN. The loss there is 0 with zero derivatives of every order
  // (it behaves as u^(γ+1)), so the factor is taken as the constant 0 (γ > 0) and pow only ever sees
  // a nonzero u: where() alone would not do, as the unselected branch's NaN still reaches the
  // gradient (0·NaN). γ = 0 is cross-entropy, with no factor at all.
  if (o.gamma != 0) {
    const Tensor u = 1.0 - exp(log_pt);
    const Tensor saturated = eq(u, zeros_like(u));
    per = per * where(saturated, zeros_like(u), pow(where(saturated, ones_like(u), u), o.gamma));
  }
  if (o.alpha.defined()) per = per * take_class(o.alpha, t.clean);
  return {masked(per, t.valid), sum(t.valid)};
}

Unreduced squared_error(const Tensor& input, const Tensor& target) {
  check_same_float("mse_loss", input, target, "input", "target");
  return {square(input - target), {}};
}

Unreduced absolute_error(const Tensor& input, const Tensor& target) {
  check_same_float("l1_loss", input, target, "input", "target");
  return {abs(input - target), {}};
}

Unreduced smooth_l1(const Tensor& input, const Tensor& target, double beta) {
  check_same_float("smooth_l1_loss", input, target, "input", "target");
  EF_CHECK(beta >= 0, "smooth_l1_loss: beta must be non-negative, got ", beta);
  const Tensor d = input - target;
  const Tensor ad = abs(d);
  if (beta == 0) return {ad, {}};  // as torch: the quadratic part vanishes
  const Tensor quadratic = lt(ad, scalar_tensor(beta, {.dtype = d.dtype(), .device = d.device()}));
  return {where(quadratic, square(d) * (0.5 / beta), ad - 0.5 * beta), {}};
}

Unreduced bce_with_logits(const Tensor& logits, const Tensor& target, const BceOptions& o) {
  const char* loss = "binary_cross_entropy_with_logits";
  check_same_float(loss, logits, target, "logits", "target");
  for (const auto& [w, what] : {std::pair{o.weight, "weight"}, std::pair{o.pos_weight, "pos_weight"}}) {
    if (!w.defined()) continue;
    EF_CHECK(w.dtype() == logits.dtype() && w.device() == logits.device(), loss, ": ", what, " is ", w.str(),
             " but logits are ", logits.str());
    bool broadcasts = w.dim() <= logits.dim();
    for (int64_t i = 1; broadcasts && i <= w.dim(); ++i) broadcasts = w.size(-i) == 1 || w.size(-i) == logits.size(-i);
    EF_CHECK(broadcasts, loss, ": ", what, " of shape ", shape_str(w.shape()), " does not broadcast to logits ",
             shape_str(logits.shape()));
  }
  // softplus(-x) = m + log(e^-m + e^(-x-m)) for any m; m = max(-x, 0) keeps both exponents ≤ 0. The
  // identity holds for every m, so m is a detached constant and the derivatives stay exact.
  const Tensor m = relu(neg(logits.detach()));
  const Tensor softplus_neg = m + log(exp(neg(m)) + exp(neg(logits) - m));
  const Tensor log_weight = o.pos_weight.defined() ? (o.pos_weight - 1.0) * target + 1.0 : Tensor();
  Tensor per = (1.0 - target) * logits + (log_weight.defined() ? log_weight * softplus_neg : softplus_neg);
  if (o.weight.defined()) per = per * o.weight;
  return {per, {}};
}

Tensor reduced(const Unreduced& u, Reduction reduction) {
  if (reduction != Reduction::Mean || !u.divisor.defined()) return reduce(u.losses, reduction);
  return sum(u.losses) / nonzero(u.divisor);
}

LossParts parts_of(const Unreduced& u) {
  const Tensor total = sum(u.losses);
  if (u.divisor.defined()) return LossParts(total, u.divisor.detach());
  return LossParts(total, static_cast<double>(u.losses.numel()));
}

}  // namespace detail

using detail::parts_of;
using detail::reduced;

Tensor reduce(const Tensor& losses, Reduction reduction) {
  EF_CHECK(losses.defined(), "reduce: losses are undefined");
  switch (reduction) {
    case Reduction::None:
      return losses;
    case Reduction::Sum:
      return sum(losses);
    case Reduction::Mean:
      break;
  }
  return losses.numel() == 0 ? sum(losses) : mean(losses);
}

Tensor cross_entropy(const Tensor& logits, const Tensor& target, const CrossEntropyOptions& o) {
  return reduced(detail::weighted_nll("cross_entropy", logits, true, target, o, o.label_smoothing), o.reduction);
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& target, const CrossEntropyOptions& o) {
  return reduced(detail::weighted_nll("nll_loss", log_probs, false, target, o, 0.0), o.reduction);
}

Tensor valid_weight(const Tensor& target, int64_t ignore_index, const Tensor& weight) {
  EF_CHECK(target.defined(), "valid_weight: target is undefined");
  if (!weight.defined()) {
    EF_CHECK(target.dtype() == kInt64, "valid_weight: target must hold int64 class indices, got ",
             dtype_name(target.dtype()));
    return sum(to_dtype(
        ne(target, scalar_tensor(static_cast<double>(ignore_index), {.dtype = kInt64, .device = target.device()})),
        kFloat64));
  }
  EF_CHECK(weight.dim() == 1 && is_floating(weight.dtype()), "valid_weight: weight must be a 1-D float tensor, got ",
           weight.str());
  EF_CHECK(weight.device() == target.device(), "valid_weight: weight is on ", weight.device().str(),
           " but target is on ", target.device().str());
  const detail::ClassTarget t = detail::class_target("valid_weight", target, weight.size(0), ignore_index, kFloat64);
  return sum(masked(take_class(to_dtype(weight, kFloat64), t.clean), t.valid));
}

Tensor focal_loss(const Tensor& logits, const Tensor& target, const FocalOptions& o) {
  return reduced(detail::focal(logits, target, o), o.reduction);
}

Tensor mse_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  return reduced(detail::squared_error(input, target), reduction);
}

Tensor l1_loss(const Tensor& input, const Tensor& target, Reduction reduction) {
  return reduced(detail::absolute_error(input, target), reduction);
}

Tensor smooth_l1_loss(const Tensor& input, const Tensor& target, double beta, Reduction reduction) {
  return reduced(detail::smooth_l1(input, target, beta), reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target, const BceOptions& o) {
  return reduced(detail::bce_with_logits(logits, target, o), o.reduction);
}

// --- LossParts and the loss objects ------------------------------------------------------------------

LossParts::LossParts(const Tensor& sum, const Tensor& weight) {
  EF_CHECK(sum.defined() && sum.numel() == 1 && weight.defined() && weight.numel() == 1,
           "LossParts: the sum and the weight must be one-element tensors, got ",
           sum.defined() ? sum.str() : "undefined", " and ", weight.defined() ? weight.str() : "undefined");
  EF_CHECK(sum.dtype() == weight.dtype() && sum.device() == weight.device(), "LossParts: the sum is ", sum.str(),
           " but the weight is ", weight.str());
  terms.push_back({reshape(sum, {}), reshape(weight.detach(), {}), std::nullopt});
}

LossParts::LossParts(const Tensor& sum, double weight) {
  EF_CHECK(sum.defined() && sum.numel() == 1, "LossParts: the sum must be a one-element tensor, got ",
           sum.defined() ? sum.str() : "undefined");
  EF_CHECK(std::isfinite(weight) && weight >= 0, "LossParts: the weight must be finite and not negative, got ", weight);
  terms.push_back({reshape(sum, {}), Tensor(), weight});
}

LossParts LossParts::operator+(const LossParts& other) const {
  LossParts out = *this;
  out.terms.insert(out.terms.end(), other.terms.begin(), other.terms.end());
  return out;
}

LossParts LossParts::operator*(double factor) const {
  LossParts out = *this;
  for (Term& t : out.terms) t.sum = t.sum * factor;
  return out;
}

Tensor LossParts::Term::value() const {
  if (!host_weight) return sum / nonzero(weight);
  // A weight of 1 divides by nothing (x·1 is x): no kernel.
  return *host_weight == 0 || *host_weight == 1 ? sum : sum * (1.0 / *host_weight);
}

Tensor LossParts::value() const {
  EF_CHECK(!terms.empty(), "LossParts::value: no terms");
  Tensor total;
  for (const Term& t : terms) {
    const Tensor v = t.value();
    total = total.defined() ? total + v : v;
  }
  return total;
}

// A loss object's tensors (class weights) go with the output to its device, differentiably, so that
// one object serves every device of a DataParallelCriterion, as a replicated torch loss module does.
namespace {
Tensor on_device_of(const Tensor& t, const Tensor& output) {
  return t.defined() && output.defined() && t.device() != output.device() ? t.to(output.device()) : t;
}
CrossEntropyOptions on_device_of(CrossEntropyOptions o, const Tensor& output) {
  o.weight = on_device_of(o.weight, output);
  return o;
}
FocalOptions on_device_of(FocalOptions o, const Tensor& output) {
  o.alpha = on_device_of(o.alpha, output);
  return o;
}
BceOptions on_device_of(BceOptions o, const Tensor& output) {
  o.weight = on_device_of(o.weight, output);
  o.pos_weight = on_device_of(o.pos_weight, output);
  return o;
}
}  // namespace

Tensor CrossEntropyLoss::operator()(const Tensor& logits, const Tensor& target) const {
  return cross_entropy(logits, target, on_device_of(options, logits));
}
LossParts CrossEntropyLoss::parts(const Tensor& logits, const Tensor& target) const {
  const CrossEntropyOptions o = on_device_of(options, logits);
  return parts_of(detail::weighted_nll("cross_entropy", logits, true, target, o, o.label_smoothing));
}
Tensor NllLoss::operator()(const Tensor& log_probs, const Tensor& target) const {
  return nll_loss(log_probs, target, on_device_of(options, log_probs));
}
LossParts NllLoss::parts(const Tensor& log_probs, const Tensor& target) const {
  return parts_of(detail::weighted_nll("nll_loss", log_probs, false, target, on_device_of(options, log_probs), 0.0));
}
Tensor FocalLoss::operator()(const Tensor& logits, const Tensor& target) const {
  return focal_loss(logits, target, on_device_of(options, logits));
}
LossParts FocalLoss::parts(const Tensor& logits, const Tensor& target) const {
  return parts_of(detail::focal(logits, target, on_device_of(options, logits)));
}
Tensor MseLoss::operator()(const Tensor& input, const Tensor& target) const {
  return mse_loss(input, target, reduction);
}
LossParts MseLoss::parts(const Tensor& input, const Tensor& target) const {
  return parts_of(detail::squared_error(input, target));
}
Tensor L1Loss::operator()(const Tensor& input, const Tensor& target) const {
  return l1_loss(input, target, reduction);
}
LossParts L1Loss::parts(const Tensor& input, const Tensor& target) const {
  return parts_of(detail::absolute_error(input, target));
}
Tensor SmoothL1Loss::operator()(const Tensor& input, const Tensor& target) const {
  return smooth_l1_loss(input, target, beta, reduction);
}
LossParts SmoothL1Loss::parts(const Tensor& input, const Tensor& target) const {
  return parts_of(detail::smooth_l1(input, target, beta));
}
Tensor BceWithLogitsLoss::operator()(const Tensor& logits, const Tensor& target) const {
  return binary_cross_entropy_with_logits(logits, target, on_device_of(options, logits));
}
LossParts BceWithLogitsLoss::parts(const Tensor& logits, const Tensor& target) const {
  return parts_of(detail::bce_with_logits(logits, target, on_device_of(options, logits)));
}

}  // namespace evenflow::losses
