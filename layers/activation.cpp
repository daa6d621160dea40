// Elementwise activations (see activation.h).
#include "evenflow/layers/activation.h"

namespace evenflow::nn {

Tensor ReLU::forward(const Tensor& x) {
  util::check_input_dims("ReLU", x, 0);
  return relu(x);
}

Tensor LeakyReLU::forward(const Tensor& x) {
  util::check_input_dims("LeakyReLU", x, 0);
  return leaky_relu(x, slope_);
}

std::string LeakyReLU::extra_repr() const {
  return "negative_slope=" + util::py_float(slope_);
}

Tensor ELU::forward(const Tensor& x) {
  util::check_input_dims("ELU", x, 0);
  return elu(x, alpha_);
}

std::string ELU::extra_repr() const {
  return "alpha=" + util::py_float(alpha_);
}

Tensor Sigmoid::forward(const Tensor& x) {
  util::check_input_dims("Sigmoid", x, 0);
  return sigmoid(x);
}

Tensor Tanh::forward(const Tensor& x) {
  util::check_input_dims("Tanh", x, 0);
  return tanh(x);
}

Softplus::Softplus(double beta, double threshold) : beta_(beta), threshold_(threshold) {
  EF_CHECK(beta > 0, "Softplus: beta must be positive, got ", beta);
}

Tensor Softplus::forward(const Tensor& x) {
  util::check_input_dims("Softplus", x, 0);
  return softplus(x, beta_, threshold_);
}

std::string Softplus::extra_repr() const {
  return "beta=" + util::py_float(beta_) + ", threshold=" + util::py_float(threshold_);
}

}  // namespace evenflow::nn
