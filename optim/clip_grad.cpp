// Gradient clipping (see clip_grad.h), as PyTorch 1.13's clip_grad_norm_: the total is the norm of
// the per-gradient norms, the coefficient max_norm / (total + 1e-6) is applied when below 1.
#include "evenflow/optim/clip_grad.h"

#include <cmath>

#include "evenflow/engine/ops.h"

namespace evenflow::optim {

double clip_grad_norm_(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  EF_CHECK(max_norm >= 0, "clip_grad_norm_: max_norm must be non-negative, got ", max_norm);
  EF_CHECK(norm_type > 0, "clip_grad_norm_: norm_type must be positive, got ", norm_type);
  std::vector<Tensor> grads;
  for (size_t i = 0; i < params.size(); ++i) {
    EF_CHECK(params[i].defined(), "clip_grad_norm_: parameter ", i, " is undefined");
    if (params[i].grad().defined()) grads.push_back(params[i].grad().detach());
  }
  if (grads.empty()) return 0.0;
  NoGradGuard no_grad;
  const bool inf = std::isinf(norm_type);
  double total = 0;
  for (const Tensor& g : grads) {
    const double n = g.numel() == 0 ? 0.0 : inf ? amax(abs(g)).item() : norm(g, norm_type).item();
    total = inf ? std::max(total, n) : total + std::pow(n, norm_type);
  }
  if (!inf) total = norm_type == 2.0 ? std::sqrt(total) : std::pow(total, 1.0 / norm_type);
  const double coef = max_norm / (total + 1e-6);
  // Written so that a NaN total scales the gradients by NaN, as PyTorch's clamp does.
  if (!(coef >= 1.0))
    for (const Tensor& g : grads) g.mul_(coef);
  return total;
}

}  // namespace evenflow::optim
