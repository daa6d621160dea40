// Dropout (see dropout.h).
#include "evenflow/layers/dropout.h"

namespace evenflow::nn {

Dropout::Dropout(double p) : p_(p) {
  EF_CHECK(p >= 0 && p <= 1, "Dropout: p must be in [0, 1], got ", p);
}

Tensor Dropout::forward(const Tensor& x) {
  util::check_input_dims("Dropout", x, 0);
  return dropout(x, p_, is_training());
}

std::string Dropout::extra_repr() const {
  return "p=" + util::py_float(p_) + ", inplace=False";
}

}  // namespace evenflow::nn
