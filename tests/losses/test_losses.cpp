// The properties of the losses that the PyTorch fixture does not show: ignored pixels are invisible
// (value and gradient), a chunk where every pixel is ignored gives exactly 0 with a zero gradient,
// a batch split in uneven chunks gives the whole batch's loss and gradients (Note [Losses across
// devices]), gradient penalties draw from the device's generator and survive a zero gradient, and
// bad arguments raise ef::Error naming the loss and the problem.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <random>

#include "evenflow/losses/losses.h"
#include "tests/testing/gradcheck.h"
#include "tests/testing/helpers.h"

using namespace evenflow;
using namespace evenflow::testing;
using namespace evenflow::losses;

namespace {

constexpr int64_t kIgnore = 255;
constexpr int64_t kClasses = 3;

Tensor random_logits(const Shape& shape, uint64_t seed) {
  manual_seed(cpu(), seed);
  return randn(shape, {.dtype = kFloat64}) * 1.5;
}

// Classes in [0, kClasses), each pixel ignored with probability `ignored`.
Tensor random_target(const Shape& shape, double ignored, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> cls(0, kClasses - 1);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<int64_t> v(static_cast<size_t>(numel_of(shape)));
  for (int64_t& x : v) x = u(rng) < ignored ? kIgnore : cls(rng);
  return from_int_vector(v, shape);
}

using SegLoss = std::function<Tensor(const Tensor& logits, const Tensor& target, Reduction)>;

// The losses with ignore_index, as functions of (logits, target, reduction), ignoring kIgnore.
std::vector<std::pair<std::string, SegLoss>> ignoring_losses(const Tensor& class_weight) {
  return {
      {"cross_entropy",
       [class_weight](const Tensor& x, const Tensor& t, Reduction r) {
         return cross_entropy(
             x, t, {.ignore_index = kIgnore, .weight = class_weight, .label_smoothing = 0.1, .reduction = r});
       }},
      {"nll_loss",
       [class_weight](const Tensor& x, const Tensor& t, Reduction r) {
         return nll_loss(log_softmax(x, 1), t, {.ignore_index = kIgnore, .weight = class_weight, .reduction = r});
       }},
      {"focal_loss",
       [class_weight](const Tensor& x, const Tensor& t, Reduction r) {
         return focal_loss(x, t, {.gamma = 2.0, .alpha = class_weight, .ignore_index = kIgnore, .reduction = r});
       }},
      {"dice_loss",
       [](const Tensor& x, const Tensor& t, Reduction r) {
         return dice_loss(x, t, {.smooth = 1.0, .ignore_index = kIgnore, .reduction = r});
       }},
      {"dice_loss smooth 0",
       [](const Tensor& x, const Tensor& t, Reduction r) {
         return dice_loss(x, t, {.smooth = 0.0, .ignore_index = kIgnore, .reduction = r});
       }},
      {"lovasz_softmax", [](const Tensor& x, const Tensor& t,
                            Reduction r) { return lovasz_softmax(x, t, {.ignore_index = kIgnore, .reduction = r}); }},
      {"lovasz_softmax all classes",
       [](const Tensor& x, const Tensor& t, Reduction r) {
         return lovasz_softmax(x, t, {.ignore_index = kIgnore, .only_present = false, .reduction = r});
       }},
      {"ohem_cross_entropy",
       [](const Tensor& x, const Tensor& t, Reduction r) {
         return ohem_cross_entropy(x, t, {.threshold = 0.7, .min_kept = 5, .ignore_index = kIgnore, .reduction = r});
       }},
  };
}

// 1 at the logits of ignored pixels ([N, C, H, W], broadcast over C), else 0.
Tensor ignored_mask(const Tensor& target, int64_t classes) {
  const Tensor ignored = to_dtype(eq(target, from_int_vector({kIgnore}, {})), kFloat64);
  return expand(unsqueeze(ignored, 1), {target.size(0), classes, target.size(1), target.size(2)});
}

bool all_exactly_zero(const Tensor& t) {
  for (double v : t.to_vector())
    if (v != 0.0) return false;
  return true;
}

bool all_finite(const Tensor& t) {
  for (double v : t.to_vector())
    if (!std::isfinite(v)) return false;
  return true;
}

void check_close(const Tensor& got, const Tensor& want, double tol, const std::string& what) {
  const std::string mismatch = compare(got, want, tol, tol);
  CHECK_MESSAGE(mismatch.empty(), what, ": ", mismatch);
}

bool mentions(const std::string& message, const std::string& part) {
  const bool found = message.find(part) != std::string::npos;
  if (!found) MESSAGE("message '", message, "' does not contain '", part, "'");
  return found;
}

}  // namespace

// --- ignore_index ----------------------------------------------------------------------------------

TEST_CASE("ignored pixels change neither the loss nor get any gradient") {
  const Tensor logits = random_logits({2, kClasses, 4, 5}, 31);
  const Tensor target = random_target({2, 4, 5}, 0.3, 31);
  const Tensor ignored = ignored_mask(target, kClasses);
  REQUIRE(sum(ignored).item() > 0);
  const Tensor weight = from_vector({0.5, 1.5, 1.0}, {3}, {.dtype = kFloat64});
  for (const auto& [name, loss] : ignoring_losses(weight)) {
    CAPTURE(name);
    for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
      const Tensor x = logits.detach().clone().requires_grad_();
      const Tensor value = loss(x, target, r);
      const Tensor g = grad({sum(value)}, {x})[0];
      CHECK(all_finite(g));
      CHECK(all_exactly_zero(g * ignored));
      // Other logits at the ignored pixels: bitwise the same loss.
      const Tensor moved = loss(logits + ignored * 7.0, target, r);
      CHECK(moved.to_vector() == value.to_vector());
    }
  }
}

TEST_CASE("cross_entropy and focal_loss with ignore_index equal the loss over the valid pixels alone") {
  const Tensor logits = random_logits({2, kClasses, 4, 5}, 32);
  const Tensor target = random_target({2, 4, 5}, 0.3, 32);
  std::vector<int64_t> rows, kept_targets;
  const std::vector<int64_t> t = target.to_int_vector();
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == kIgnore) continue;
    rows.push_back(static_cast<int64_t>(i));
    kept_targets.push_back(t[i]);
  }
  const Tensor flat = reshape(permute(logits, {0, 2, 3, 1}), {-1, kClasses});
  const Tensor valid_logits = index_select(flat, 0, from_int_vector(rows, {static_cast<int64_t>(rows.size())}));
  const Tensor valid_target = from_int_vector(kept_targets, {static_cast<int64_t>(kept_targets.size())});
  const Tensor weight = from_vector({0.5, 1.5, 1.0}, {3}, {.dtype = kFloat64});
  const CrossEntropyOptions ce{.ignore_index = kIgnore, .weight = weight, .label_smoothing = 0.2};
  check_close(cross_entropy(logits, target, ce),
              cross_entropy(valid_logits, valid_target, {.weight = weight, .label_smoothing = 0.2}), 1e-14,
              "cross_entropy");
  check_close(focal_loss(logits, target, {.alpha = weight, .ignore_index = kIgnore}),
              focal_loss(valid_logits, valid_target, {.alpha = weight}), 1e-14, "focal_loss");
}

TEST_CASE("a chunk where every pixel is ignored: mean 0, gradient exactly 0, no NaN") {
  const Tensor logits = random_logits({2, kClasses, 3, 4}, 33);
  const Tensor target = full({2, 3, 4}, static_cast<double>(kIgnore), {.dtype = kInt64});
  const Tensor weight = from_vector({0.5, 1.5, 1.0}, {3}, {.dtype = kFloat64});
  for (const auto& [name, loss] : ignoring_losses(weight)) {
    CAPTURE(name);
    for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
      const Tensor x = logits.detach().clone().requires_grad_();
      const Tensor value = loss(x, target, r);
      CHECK(all_exactly_zero(value));
      const Tensor g = grad({sum(value)}, {x})[0];
      CHECK(all_exactly_zero(g));
    }
  }
  CHECK(valid_weight(target, kIgnore).item() == 0.0);
  CHECK(valid_weight(target, kIgnore, weight).item() == 0.0);
}

TEST_CASE("reduce: Mean over zero elements is 0; None and Sum") {
  const Tensor empty_losses = zeros({0}, {.dtype = kFloat64});
  CHECK(reduce(empty_losses, Reduction::Mean).item() == 0.0);
  CHECK(reduce(empty_losses, Reduction::Sum).item() == 0.0);
  const Tensor l = from_vector({1, 2, 6}, {3}, {.dtype = kFloat64});
  CHECK(reduce(l, Reduction::Mean).item() == 3.0);
  CHECK(reduce(l, Reduction::Sum).item() == 9.0);
  CHECK(reduce(l, Reduction::None).same(l));
}

// --- Note [Losses across devices] ------------------------------------------------------------------

namespace {

const std::vector<int64_t> kChunks{3, 2, 2};

// Σ over the chunks of chunk_loss(logits chunk, target chunk), its gradient w.r.t. the whole logits,
// compared with whole_loss on the whole batch.
void check_chunked(const std::string& what, const Tensor& logits, const Tensor& target,
                   const std::function<Tensor(const Tensor&, const Tensor&)>& whole_loss,
                   const std::function<Tensor(const Tensor&, const Tensor&)>& chunk_loss) {
  CAPTURE(what);
  const Tensor x = logits.detach().clone().requires_grad_();
  const Tensor whole = whole_loss(x, target);
  Tensor chunked = zeros({}, {.dtype = kFloat64});
  int64_t start = 0;
  for (int64_t n : kChunks) {
    chunked = chunked + chunk_loss(slice(x, 0, start, start + n), slice(target, 0, start, start + n));
    start += n;
  }
  REQUIRE(start == logits.size(0));
  check_close(chunked, whole, 1e-12, "value");
  check_close(grad({chunked}, {x})[0], grad({whole}, {x})[0], 1e-12, "gradient");
}

double fraction(const Tensor& chunk) {
  int64_t total = 0;
  for (int64_t n : kChunks) total += n;
  return static_cast<double>(chunk.size(0)) / static_cast<double>(total);
}

void check_all_chunked(const Tensor& logits, const Tensor& target) {
  const Tensor weight = from_vector({0.5, 1.5, 1.0}, {3}, {.dtype = kFloat64});
  const CrossEntropyOptions ce{.ignore_index = kIgnore, .weight = weight, .label_smoothing = 0.1};
  CrossEntropyOptions ce_sum = ce;
  ce_sum.reduction = Reduction::Sum;
  const Tensor ce_divisor = valid_weight(target, kIgnore, weight);
  check_chunked(
      "cross_entropy", logits, target, [&](const Tensor& x, const Tensor& t) { return cross_entropy(x, t, ce); },
      [&](const Tensor& x, const Tensor& t) { return cross_entropy(x, t, ce_sum) / ce_divisor; });
  check_chunked(
      "nll_loss", logits, target, [&](const Tensor& x, const Tensor& t) { return nll_loss(log_softmax(x, 1), t, ce); },
      [&](const Tensor& x, const Tensor& t) { return nll_loss(log_softmax(x, 1), t, ce_sum) / ce_divisor; });
  const FocalOptions focal{.gamma = 1.5, .alpha = weight, .ignore_index = kIgnore};
  FocalOptions focal_sum = focal;
  focal_sum.reduction = Reduction::Sum;
  const Tensor count = valid_weight(target, kIgnore);
  check_chunked(
      "focal_loss", logits, target, [&](const Tensor& x, const Tensor& t) { return focal_loss(x, t, focal); },
      [&](const Tensor& x, const Tensor& t) { return focal_loss(x, t, focal_sum) / count; });
  const std::vector<std::pair<std::string, SegLoss>> per_image{
      {"dice_loss", [](const Tensor& x, const Tensor& t,
                       Reduction r) { return dice_loss(x, t, {.ignore_index = kIgnore, .reduction = r}); }},
      {"lovasz_softmax", [](const Tensor& x, const Tensor& t,
                            Reduction r) { return lovasz_softmax(x, t, {.ignore_index = kIgnore, .reduction = r}); }},
      {"ohem_cross_entropy",
       [](const Tensor& x, const Tensor& t, Reduction r) {
         return ohem_cross_entropy(x, t, {.min_kept = 6, .ignore_index = kIgnore, .reduction = r});
       }},
  };
  for (const auto& [name, loss] : per_image) {
    check_chunked(
        name + " mean", logits, target, [&](const Tensor& x, const Tensor& t) { return loss(x, t, Reduction::Mean); },
        [&](const Tensor& x, const Tensor& t) { return loss(x, t, Reduction::Mean) * fraction(x); });
    check_chunked(
        name + " sum", logits, target, [&](const Tensor& x, const Tensor& t) { return loss(x, t, Reduction::Sum); },
        [&](const Tensor& x, const Tensor& t) { return loss(x, t, Reduction::Sum); });
  }
}

}  // namespace

TEST_CASE("uneven chunks (3, 2, 2 of 7) give the whole batch's loss and gradients") {
  const Tensor logits = random_logits({7, kClasses, 4, 5}, 41);
  check_all_chunked(logits, random_target({7, 4, 5}, 0.2, 41));
}

TEST_CASE("uneven chunks, the last one entirely ignored, give the whole batch's loss and gradients") {
  const Tensor logits = random_logits({7, kClasses, 4, 5}, 42);
  const Tensor target = random_target({7, 4, 5}, 0.2, 42);
  fill_(slice(target, 0, 5, 7), static_cast<double>(kIgnore));
  check_all_chunked(logits, target);
}

// --- Gradient penalties ----------------------------------------------------------------------------

namespace {

// A small critic on [N, 1, 2, 3] samples: flatten, linear 6 -> 5, tanh, linear 5 -> 1.
std::vector<Tensor> critic_params(uint64_t seed) {
  manual_seed(cpu(), seed);
  std::vector<Tensor> p{randn({5, 6}, {.dtype = kFloat64}) * 0.7, randn({5}, {.dtype = kFloat64}) * 0.3,
                        randn({1, 5}, {.dtype = kFloat64}) * 0.7, randn({1}, {.dtype = kFloat64}) * 0.3};
  for (Tensor& t : p) t.requires_grad_();
  return p;
}

Critic critic_of(const std::vector<Tensor>& p) {
  return [p](const Tensor& x) { return linear(tanh(linear(reshape(x, {x.size(0), -1}), p[0], p[1])), p[2], p[3]); };
}

// Σ over the chunks of (n_i / N)·penalty(chunk) against penalty(whole), values and the gradients of
// the critic's parameters.
void check_penalty_chunked(const std::string& what, const std::vector<Tensor>& params,
                           const std::function<Tensor(int64_t start, int64_t n)>& penalty) {
  CAPTURE(what);
  const Tensor whole = penalty(0, 7);
  Tensor chunked = zeros({}, {.dtype = kFloat64});
  int64_t start = 0;
  for (int64_t n : kChunks) {
    chunked = chunked + penalty(start, n) * (static_cast<double>(n) / 7.0);
    start += n;
  }
  check_close(chunked, whole, 1e-12, "value");
  const std::vector<Tensor> gw = grad({whole}, params, {}, {.allow_unused = true});
  const std::vector<Tensor> gc = grad({chunked}, params, {}, {.allow_unused = true});
  for (size_t i = 0; i < params.size(); ++i) {
    CHECK(gw[i].defined() == gc[i].defined());
    if (gw[i].defined()) check_close(gc[i], gw[i], 1e-12, "parameter gradient");
  }
}

}  // namespace

TEST_CASE("gradient penalties: uneven chunks with the same draws give the whole batch's penalty") {
  const std::vector<Tensor> p = critic_params(51);
  manual_seed(cpu(), 52);
  const Tensor real = randn({7, 1, 2, 3}, {.dtype = kFloat64});
  const Tensor fake = randn({7, 1, 2, 3}, {.dtype = kFloat64});
  const Tensor eps = rand({7, 1, 1, 1}, {.dtype = kFloat64});
  const Tensor noise = rand({7, 1, 2, 3}, {.dtype = kFloat64});
  const double real_std = std::sqrt(var(real, {}).item());
  auto part = [](const Tensor& t, int64_t start, int64_t n) { return slice(t, 0, start, start + n); };
  check_penalty_chunked("wgan_gp_penalty", p, [&](int64_t s, int64_t n) {
    return wgan_gp_penalty(critic_of(p), part(real, s, n), part(fake, s, n), {.eps = part(eps, s, n)});
  });
  check_penalty_chunked("dragan_penalty", p, [&](int64_t s, int64_t n) {
    return dragan_penalty(critic_of(p), part(real, s, n), {.noise = part(noise, s, n), .real_std = real_std});
  });
  check_penalty_chunked("r1_penalty", p, [&](int64_t s, int64_t n) {
    return r1_penalty(critic_of(p), part(real, s, n), {.gamma = 4.0});
  });
  // Without real_std, DRAGAN uses the batch's own (unbiased) std.
  check_close(dragan_penalty(critic_of(p), real, {.noise = noise}),
              dragan_penalty(critic_of(p), real, {.noise = noise, .real_std = real_std}), 1e-14, "dragan std");
}

TEST_CASE("gradient penalties draw eps and noise from the batch's device's generator") {
  const std::vector<Tensor> p = critic_params(53);
  for (const Device& d : {cpu(), cpu(2)}) {
    CAPTURE(d.str());
    std::vector<Tensor> pd;
    for (const Tensor& t : p) pd.push_back(t.detach().to(d));
    manual_seed(d, 54);
    const Tensor real = randn({4, 1, 2, 3}, {.dtype = kFloat64, .device = d});
    const Tensor fake = randn({4, 1, 2, 3}, {.dtype = kFloat64, .device = d});
    const GeneratorState state = generator_state(d);
    const Tensor drawn = wgan_gp_penalty(critic_of(pd), real, fake);
    CHECK(drawn.device() == d);
    set_generator_state(d, state);
    const Tensor eps = rand({4, 1, 1, 1}, {.dtype = kFloat64, .device = d});
    CHECK(drawn.item() == wgan_gp_penalty(critic_of(pd), real, fake, {.eps = eps}).item());
    set_generator_state(d, state);
    const Tensor drawn_dragan = dragan_penalty(critic_of(pd), real, {.c = 0.3});
    set_generator_state(d, state);
    const Tensor noise = rand({4, 1, 2, 3}, {.dtype = kFloat64, .device = d});
    CHECK(drawn_dragan.item() == dragan_penalty(critic_of(pd), real, {.c = 0.3, .noise = noise}).item());
  }
}

TEST_CASE("gradient penalties where the critic's input gradient is zero: finite, norm subgradient 0") {
  std::vector<Tensor> p = critic_params(55);
  p[0] = zeros({5, 6}, {.dtype = kFloat64}).requires_grad_();  // D(x) no longer depends on x
  manual_seed(cpu(), 56);
  const Tensor real = randn({4, 1, 2, 3}, {.dtype = kFloat64});
  const Tensor fake = randn({4, 1, 2, 3}, {.dtype = kFloat64});
  const Tensor gp = wgan_gp_penalty(critic_of(p), real, fake, {.lambda = 10.0});
  CHECK(gp.item() == 10.0);
  const Tensor r1 = r1_penalty(critic_of(p), real);
  CHECK(r1.item() == 0.0);
  for (const Tensor& g : grad({gp + r1}, p, {}, {.allow_unused = true})) {
    if (g.defined()) CHECK(all_finite(g));
  }
}

// --- Errors ----------------------------------------------------------------------------------------

TEST_CASE("bad targets: wrong dtype, shape, device, class out of range") {
  const Tensor logits = random_logits({2, 3, 4}, 61);
  const Tensor target = random_target({2, 4}, 0.0, 61);
  const Tensor float_target = to_dtype(target, kFloat64);
  CHECK(mentions(error_of([&] { cross_entropy(logits, float_target); }),
                 "cross_entropy: target must hold int64 class indices, got float64"));
  CHECK(mentions(error_of([&] { focal_loss(logits, float_target); }), "focal_loss: target must hold int64"));
  CHECK(mentions(error_of([&] { dice_loss(logits, float_target); }), "dice_loss: target must hold int64"));
  CHECK(mentions(error_of([&] { lovasz_softmax(logits, float_target); }), "lovasz_softmax: target must hold int64"));
  CHECK(mentions(error_of([&] { ohem_cross_entropy(logits, float_target); }),
                 "ohem_cross_entropy: target must hold int64"));
  CHECK(mentions(error_of([&] { valid_weight(float_target); }), "valid_weight: target must hold int64"));
  CHECK(mentions(error_of([&] {
                   cross_entropy(logits, random_target({2, 5}, 0.0, 62));
                 }),
                 "cross_entropy: target has shape [2, 5], expected [2, 4] for logits [2, 3, 4]"));
  CHECK(mentions(error_of([&] {
                   nll_loss(logits, random_target({4, 2}, 0.0, 62));
                 }),
                 "nll_loss: target has shape [4, 2], expected [2, 4]"));
  CHECK(mentions(error_of([&] { cross_entropy(logits, target.to(cpu(1))); }),
                 "cross_entropy: target is on cpu:1 but logits are on cpu:0"));
  CHECK(mentions(error_of([&] { cross_entropy(to_dtype(target, kInt64), target); }),
                 "cross_entropy: logits must be float32 or float64, got int64"));
  CHECK(mentions(error_of([&] { cross_entropy(zeros({3}, {.dtype = kFloat64}), zeros({}, {.dtype = kInt64})); }),
                 "cross_entropy: logits must be [N, C] or [N, C, d1, ...], got [3]"));
  CHECK(mentions(error_of([&] {
                   dice_loss(zeros({2, 3}, {.dtype = kFloat64}), zeros({2}, {.dtype = kInt64}));
                 }),
                 "dice_loss: logits must be [N, C, d1, ...], got [2, 3]"));

  // Class indices are checked (on the values, without differentiating anything).
  std::vector<int64_t> v = target.to_int_vector();
  v[3] = 3;
  const Tensor too_large = from_int_vector(v, target.shape());
  v[3] = -1;
  const Tensor negative = from_int_vector(v, target.shape());
  CHECK(mentions(error_of([&] { cross_entropy(logits, too_large); }),
                 "cross_entropy: target holds class 3, outside [0, 3) for logits with 3 classes (ignore_index -100)"));
  CHECK(mentions(error_of([&] { cross_entropy(logits, negative, {.ignore_index = kNoIgnore}); }),
                 "cross_entropy: target holds class -1, outside [0, 3) for logits with 3 classes (no ignore_index)"));
  CHECK(mentions(error_of([&] { focal_loss(logits, too_large); }), "focal_loss: target holds class 3"));
  CHECK(mentions(error_of([&] { dice_loss(logits, negative); }), "dice_loss: target holds class -1"));
  CHECK(mentions(error_of([&] { lovasz_softmax(logits, too_large); }), "lovasz_softmax: target holds class 3"));
  CHECK(mentions(error_of([&] { ohem_cross_entropy(logits, too_large); }), "ohem_cross_entropy: target holds class 3"));
  CHECK(mentions(error_of([&] { valid_weight(too_large, -100, ones({3}, {.dtype = kFloat64})); }),
                 "valid_weight: target holds class 3"));
  // -1 is fine when it is the ignore_index.
  CHECK(error_of([&] { cross_entropy(logits, negative, {.ignore_index = -1}); }) == "(no error)");
  // Logits that require grad: the check itself differentiates nothing.
  const Tensor x = logits.detach().clone().requires_grad_();
  CHECK(mentions(error_of([&] { cross_entropy(x, too_large); }), "outside [0, 3)"));
}

TEST_CASE("bad options and weights name the loss and the value") {
  const Tensor logits = random_logits({2, 3, 4}, 63);
  const Tensor target = random_target({2, 4}, 0.0, 63);
  CHECK(mentions(error_of([&] { cross_entropy(logits, target, {.weight = ones({4}, {.dtype = kFloat64})}); }),
                 "cross_entropy: weight has shape [4], expected [3] (one per class)"));
  CHECK(mentions(error_of([&] { cross_entropy(logits, target, {.weight = ones({3})}); }),
                 "cross_entropy: weight is float32 but logits are float64"));
  CHECK(mentions(error_of([&] { cross_entropy(logits, target, {.label_smoothing = 1.5}); }),
                 "cross_entropy: label_smoothing must be in [0, 1], got 1.5"));
  CHECK(mentions(error_of([&] { focal_loss(logits, target, {.gamma = -1}); }),
                 "focal_loss: gamma must be non-negative, got -1"));
  CHECK(mentions(error_of([&] { focal_loss(logits, target, {.alpha = ones({2}, {.dtype = kFloat64})}); }),
                 "focal_loss: alpha has shape [2], expected [3]"));
  CHECK(mentions(error_of([&] { dice_loss(logits, target, {.smooth = -1}); }),
                 "dice_loss: smooth must be non-negative, got -1"));
  CHECK(mentions(error_of([&] { ohem_cross_entropy(logits, target, {.min_kept = -2}); }),
                 "ohem_cross_entropy: min_kept must be non-negative, got -2"));
}

TEST_CASE("bad regression, binary and GAN arguments") {
  const Tensor a = zeros({3, 4}, {.dtype = kFloat64});
  CHECK(mentions(error_of([&] {
                   mse_loss(a, zeros({4, 3}, {.dtype = kFloat64}));
                 }),
                 "mse_loss: target has shape [4, 3] but input has shape [3, 4]"));
  CHECK(mentions(error_of([&] { l1_loss(a, zeros({3, 4})); }), "l1_loss: target is float32 but input is float64"));
  CHECK(mentions(error_of([&] { smooth_l1_loss(a, a, -0.5); }), "smooth_l1_loss: beta must be non-negative, got -0.5"));
  CHECK(mentions(error_of([&] {
                   binary_cross_entropy_with_logits(a, zeros({3, 4}, {.dtype = kInt64}));
                 }),
                 "binary_cross_entropy_with_logits: target is int64 but logits is float64"));
  CHECK(mentions(
      error_of([&] { binary_cross_entropy_with_logits(a, a, {.pos_weight = ones({3}, {.dtype = kFloat64})}); }),
      "binary_cross_entropy_with_logits: pos_weight of shape [3] does not broadcast to logits [3, 4]"));
  CHECK(mentions(error_of([&] { wasserstein_critic_loss(a, zeros({0}, {.dtype = kFloat64})); }),
                 "wasserstein_critic_loss: d_fake is empty"));

  const std::vector<Tensor> p = critic_params(64);
  const Tensor real = zeros({4, 1, 2, 3}, {.dtype = kFloat64});
  CHECK(mentions(error_of([&] {
                   wgan_gp_penalty(critic_of(p), real, zeros({3, 1, 2, 3}, {.dtype = kFloat64}));
                 }),
                 "wgan_gp_penalty: fake has shape [3, 1, 2, 3], expected [4, 1, 2, 3]"));
  CHECK(mentions(error_of([&] {
                   wgan_gp_penalty(critic_of(p), real, real, {.eps = zeros({4, 1, 2, 3}, {.dtype = kFloat64})});
                 }),
                 "wgan_gp_penalty: eps has shape [4, 1, 2, 3], expected [4, 1, 1, 1]"));
  CHECK(mentions(error_of([&] {
                   dragan_penalty(critic_of(p), real, {.noise = zeros({4, 6}, {.dtype = kFloat64})});
                 }),
                 "dragan_penalty: noise has shape [4, 6], expected [4, 1, 2, 3]"));
  const Critic wide = [&](const Tensor& x) { return reshape(x, {x.size(0), -1}); };
  CHECK(mentions(error_of([&] { r1_penalty(wide, real); }),
                 "r1_penalty: the critic must return [4] or [4, 1] for a batch of 4, got [4, 6]"));
  CHECK(mentions(error_of([&] {
                   r1_penalty(critic_of(p), zeros({4, 1, 2, 3}, {.dtype = kInt64}));
                 }),
                 "r1_penalty: real must be float32 or float64, got int64"));
}
