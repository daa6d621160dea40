// Ops that draw random numbers: dropout, its mask drawn per sample (batch_bernoulli, Note [Random
// numbers per sample] in tensor.h). Composite: its gradient is mul's.
#include "evenflow/engine/ops.h"

#include "evenflow/engine/ops_internal.h"

namespace evenflow {

Tensor dropout(const Tensor& x, double p, bool training) {
  detail::check_float("dropout", x);
  EF_CHECK(p >= 0 && p <= 1, "dropout: p must be in [0, 1], got ", p);
  if (!training || p == 0) return x;
  if (p == 1) return x * zeros_like(x);
  // Per sample, so that N devices draw the masks one device draws (Note [Random numbers per sample]).
  const Tensor mask = mul_scalar(batch_bernoulli(x.shape(), 1.0 - p, detail::options_of(x)), 1.0 / (1.0 - p));
  return x * mask;
}

}  // namespace evenflow
