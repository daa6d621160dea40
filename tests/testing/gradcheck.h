// Numerical derivative checks, as torch.autograd.gradcheck / gradgradcheck: the analytic Jacobian
// (one backward pass per output element) against central differences (eps 1e-6), in float64,
// with |analytic - numeric| <= atol + rtol·|numeric|.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "evenflow/engine/ops.h"

namespace evenflow::testing {

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

struct GradcheckOptions {
  double eps = 1e-6;
  double atol = 1e-5;
  double rtol = 1e-3;
};

// Empty string when the check passes; otherwise a description of the first mismatch.
std::string gradcheck(const Fn& fn, const std::vector<Tensor>& inputs, const GradcheckOptions& o = {});
// gradcheck of (inputs, v) -> grad(fn(inputs), inputs, v, create_graph=true), v random.
std::string gradgradcheck(const Fn& fn, const std::vector<Tensor>& inputs, const GradcheckOptions& o = {});
// The function (inputs..., v) -> the gradients of fn at inputs along v, flattened and concatenated:
// differentiating it checks second derivatives; nesting it checks higher orders.
Fn first_derivative(const Fn& fn, size_t num_inputs);

// Element-wise |a - b| <= atol + rtol·|b| (b is the reference); a description of the worst
// mismatch, or empty.
std::string compare(const Tensor& a, const Tensor& b, double atol, double rtol);

}  // namespace evenflow::testing
