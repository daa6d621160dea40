/// @file
/// Elementwise activations, as torch.nn: ReLU, LeakyReLU, ELU, Sigmoid, Tanh, Softplus. Each is the
/// engine op of the same name; the module adds the configuration and PyTorch's printing.
#pragma once

#include "evenflow/layers/module.h"

namespace evenflow::nn {

class ReLU : public Cloneable<ReLU> {
 public:
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "ReLU"; }
};

class LeakyReLU : public Cloneable<LeakyReLU> {
 public:
  explicit LeakyReLU(double negative_slope = 0.01) : slope_(negative_slope) {}
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "LeakyReLU"; }
  std::string extra_repr() const override;
  double negative_slope() const { return slope_; }

 private:
  double slope_;
};

class ELU : public Cloneable<ELU> {
 public:
  explicit ELU(double alpha = 1.0) : alpha_(alpha) {}
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "ELU"; }
  std::string extra_repr() const override;
  double alpha() const { return alpha_; }

 private:
  double alpha_;
};

class Sigmoid : public Cloneable<Sigmoid> {
 public:
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Sigmoid"; }
};

class Tanh : public Cloneable<Tanh> {
 public:
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Tanh"; }
};

/// log(1 + exp(β·x)) / β, linear where β·x > threshold.
class Softplus : public Cloneable<Softplus> {
 public:
  explicit Softplus(double beta = 1.0, double threshold = 20.0);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Softplus"; }
  std::string extra_repr() const override;
  double beta() const { return beta_; }
  double threshold() const { return threshold_; }

 private:
  double beta_, threshold_;
};

}  // namespace evenflow::nn
