// Wasserstein losses and the gradient penalties (WGAN-GP, DRAGAN, R1). A penalty evaluates the
// critic at points x̂ that are new leaves, takes ∇D(x̂) with create_graph=true, and penalizes its
// per-sample norm: the result depends on the critic's parameters through that first derivative, so
// training the critic on it differentiates twice.
#include <cmath>
#include <string>

#include "evenflow/losses/common_internal.h"

namespace evenflow::losses {

namespace {

void check_scores(const char* loss, const Tensor& d, const char* what) {
  EF_CHECK(d.defined(), loss, ": ", what, " is undefined");
  EF_CHECK(is_floating(d.dtype()), loss, ": ", what, " must be float32 or float64, got ", dtype_name(d.dtype()));
  EF_CHECK(d.numel() > 0, loss, ": ", what, " is empty");
}

void check_batch(const char* loss, const Tensor& real) {
  EF_CHECK(real.defined(), loss, ": real is undefined");
  EF_CHECK(is_floating(real.dtype()), loss, ": real must be float32 or float64, got ", dtype_name(real.dtype()));
  EF_CHECK(real.dim() >= 1 && real.size(0) > 0, loss, ": real must be a non-empty batch [N, ...], got ",
           shape_str(real.shape()));
}

// A tensor given for `real`'s batch: same dtype and device, and the expected shape.
void check_draws(const char* loss, const char* what, const Tensor& t, const Tensor& real, const Shape& expected) {
  EF_CHECK(t.dtype() == real.dtype() && t.device() == real.device(), loss, ": ", what, " is ", t.str(), " but real is ",
           real.str());
  EF_CHECK(t.shape() == expected, loss, ": ", what, " has shape ", shape_str(t.shape()), ", expected ",
           shape_str(expected));
}

// x, detached, as a new leaf that requires grad.
Tensor leaf_of(const Tensor& x) {
  Tensor leaf = x.detach();
  leaf.requires_grad_(true);
  return leaf;
}

// ∇D(x) per sample, [N, features], recorded (create_graph) so that it can be differentiated again.
Tensor critic_gradient(const char* loss, const Critic& critic, const Tensor& x) {
  EF_CHECK(critic != nullptr, loss, ": critic is empty");
  const int64_t n = x.size(0);
  const Tensor out = critic(x);
  EF_CHECK(out.defined() &&
               ((out.dim() == 1 && out.size(0) == n) || (out.dim() == 2 && out.size(0) == n && out.size(1) == 1)),
           loss, ": the critic must return [", n, "] or [", n, ", 1] for a batch of ", n, ", got ",
           out.defined() ? shape_str(out.shape()) : "an undefined tensor");
  EF_CHECK(out.requires_grad(), loss,
           ": the critic's output does not depend on its input with gradient (is grad mode off?)");
  const Tensor g = grad({out}, {x}, {ones_like(out)}, {.create_graph = true})[0];
  return reshape(g, {n, -1});
}

// λ·mean (|g|₂ - 1)², per sample: the engine's norm, whose gradient at a zero g is the subgradient
// 0, as torch's (Note [Norm at zero] in engine/ops/reduce.cpp), and which keeps a NaN a NaN.
Tensor unit_norm_penalty(const Tensor& g, double lambda) {
  return mean(square(norm(g, 2.0, {1}) - 1.0)) * lambda;
}

}  // namespace

Tensor wasserstein_critic_loss(const Tensor& d_real, const Tensor& d_fake) {
  check_scores("wasserstein_critic_loss", d_real, "d_real");
  check_scores("wasserstein_critic_loss", d_fake, "d_fake");
  EF_CHECK(d_real.dtype() == d_fake.dtype() && d_real.device() == d_fake.device(),
           "wasserstein_critic_loss: d_real is ", d_real.str(), " but d_fake is ", d_fake.str());
  return mean(d_fake) - mean(d_real);
}

Tensor wasserstein_generator_loss(const Tensor& d_fake) {
  check_scores("wasserstein_generator_loss", d_fake, "d_fake");
  return neg(mean(d_fake));
}

Tensor wgan_gp_penalty(const Critic& critic, const Tensor& real, const Tensor& fake, const WganGpOptions& o) {
  const char* loss = "wgan_gp_penalty";
  check_batch(loss, real);
  EF_CHECK(fake.defined(), loss, ": fake is undefined");
  check_draws(loss, "fake", fake, real, real.shape());
  Shape eps_shape(static_cast<size_t>(real.dim()), 1);
  eps_shape[0] = real.size(0);
  Tensor x;
  {
    NoGradGuard no_grad;
    const Tensor eps =
        o.eps.defined() ? o.eps : batch_rand(eps_shape, {.dtype = real.dtype(), .device = real.device()});
    check_draws(loss, "eps", eps, real, eps_shape);
    x = eps * real.detach() + (1.0 - eps) * fake.detach();
  }
  return unit_norm_penalty(critic_gradient(loss, critic, leaf_of(x)), o.lambda);
}

Tensor dragan_penalty(const Critic& critic, const Tensor& real, const DraganOptions& o) {
  const char* loss = "dragan_penalty";
  check_batch(loss, real);
  Tensor x;
  {
    NoGradGuard no_grad;
    const Tensor u =
        o.noise.defined() ? o.noise : batch_rand(real.shape(), {.dtype = real.dtype(), .device = real.device()});
    check_draws(loss, "noise", u, real, real.shape());
    Tensor scale;
    if (o.real_std) {
      scale = scalar_tensor(o.c * *o.real_std, {.dtype = real.dtype(), .device = real.device()});
    } else {
      EF_CHECK(real.numel() >= 2, loss, ": std(real) needs at least 2 elements, got ", shape_str(real.shape()),
               " (pass real_std)");
      scale = sqrt(var(real.detach(), {}, true)) * o.c;
    }
    x = real.detach() + scale * u;
  }
  return unit_norm_penalty(critic_gradient(loss, critic, leaf_of(x)), o.lambda);
}

Tensor r1_penalty(const Critic& critic, const Tensor& real, const R1Options& o) {
  check_batch("r1_penalty", real);
  const Tensor g = critic_gradient("r1_penalty", critic, leaf_of(real));
  return mean(sum(square(g), {1})) * (0.5 * o.gamma);
}

}  // namespace evenflow::losses
