// Linear (see linear.h). Initialised as PyTorch: weight and bias uniform(±1/√in_features).
#include "evenflow/layers/linear.h"

#include "evenflow/layers/init.h"

namespace evenflow::nn {

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, const ModuleOptions& o)
    : in_(in_features), out_(out_features) {
  EF_CHECK(in_features >= 0 && out_features >= 0, "Linear: in_features and out_features must be non-negative, got ",
           in_features, " and ", out_features);
  const TensorOptions t = o.tensor_options();
  register_parameter("weight", empty({out_, in_}, t));
  init::default_uniform_(param("weight"), in_);
  if (bias) {
    register_parameter("bias", empty({out_}, t));
    init::default_uniform_(param("bias"), in_);
  }
}

Tensor Linear::forward(const Tensor& x) {
  util::check_input_dims("Linear", x, 1);
  check_input_matches_params(x);
  EF_CHECK(x.size(-1) == in_, "Linear: input has ", x.size(-1), " features (last dim of ", shape_str(x.shape()),
           "), expected ", in_);
  return linear(x, weight(), bias(), {.compute = compute_dtype()});
}

std::string Linear::extra_repr() const {
  return evenflow::detail::str_cat("in_features=", in_, ", out_features=", out_,
                                   ", bias=", util::py_bool(bias().defined()));
}

}  // namespace evenflow::nn
