// Flatten (see flatten.h).
#include "evenflow/layers/flatten.h"

#include <algorithm>

namespace evenflow::nn {

Tensor Flatten::forward(const Tensor& x) {
  util::check_input_dims("Flatten", x, 0);
  const int64_t n = std::max<int64_t>(x.dim(), 1);
  const int64_t start = start_ < 0 ? start_ + n : start_, end = end_ < 0 ? end_ + n : end_;
  EF_CHECK(start >= 0 && start < n && end >= 0 && end < n && start <= end, "Flatten: dims ", start_, "..", end_,
           " do not fit an input of shape ", shape_str(x.shape()));
  return flatten(x, start_, end_);
}

std::string Flatten::extra_repr() const {
  return evenflow::detail::str_cat("start_dim=", start_, ", end_dim=", end_);
}

}  // namespace evenflow::nn
