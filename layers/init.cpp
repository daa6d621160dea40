// Parameter initialisation (see init.h).
#include "evenflow/layers/init.h"

#include <cmath>

#include "evenflow/engine/autograd.h"

namespace evenflow::nn::init {

int64_t fan_in(const Shape& weight_shape) {
  EF_CHECK(weight_shape.size() >= 2, "init::fan_in: a weight needs at least 2 dims, got shape ",
           shape_str(weight_shape));
  int64_t receptive = 1;
  for (size_t i = 2; i < weight_shape.size(); ++i) receptive *= weight_shape[i];
  return weight_shape[1] * receptive;
}

void uniform_(const Tensor& t, double low, double high) {
  EF_CHECK(low <= high, "init::uniform_: low ", low, " is above high ", high);
  NoGradGuard no_grad;
  t.copy_(uniform(t.shape(), low, high, {.dtype = t.dtype(), .device = t.device()}));
}

void default_uniform_(const Tensor& t, int64_t fan_in) {
  // kaiming_uniform_(a=√5): gain √(2/(1+5)), bound gain·√(3/fan_in) = 1/√fan_in.
  const double bound = fan_in > 0 ? 1.0 / std::sqrt(static_cast<double>(fan_in)) : 0.0;
  uniform_(t, -bound, bound);
}

}  // namespace evenflow::nn::init
