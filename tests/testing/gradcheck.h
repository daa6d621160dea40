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

// Note [Normwise comparison]
// For results of long sums (a GEMM or convolution over K terms, a reduction of millions), rounding
// error does not scale with each element: it is about u·√K·rms(terms) for every element alike, so an
// element near zero carries the same absolute error as a large one and an element-wise rtol fails it
// (TF32, u = 2^-11: a conv weight gradient over K = 100352 terms has errors of ~0.13 on elements of
// any size). What bounds such error is the norm: ‖a − b‖₂ <= tol·‖b‖₂. A normwise check alone could
// hide a few wrong elements in a large tensor, so each element is also held to 10·tol·rms(b) (rounding
// error is far inside that; a wrong index or a missed tile is not). NaN and infinities must match.
std::string compare_normwise(const Tensor& a, const Tensor& b, double tol);

}  // namespace evenflow::testing
