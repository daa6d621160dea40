/// @file
/// Elementwise activations, as torch.nn: ReLU, LeakyReLU, ELU, Sigmoid, Tanh, Softplus. Each is the
/// engine op of the same name; the module adds the configuration and PyTorch's printing.
#pragma once

#include "evenflow/layers/module.h"

namespace evenflow::nn {

/// max(x, 0) elementwise, as torch.nn.ReLU: any defined input, output of the same shape.
/// Gradient: g where x > 0, else 0.
class ReLU : public Cloneable<ReLU> {
 public:
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "ReLU"; }
};

/// x where x > 0, else negative_slope·x, as torch.nn.LeakyReLU: any defined input, output of the
/// same shape. Gradient: g where x > 0, else negative_slope·g.
class LeakyReLU : public Cloneable<LeakyReLU> {
 public:
  /// `negative_slope`: the slope for x ≤ 0 (any value).
  explicit LeakyReLU(double negative_slope = 0.01) : slope_(negative_slope) {}
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "LeakyReLU"; }
  std::string extra_repr() const override;
  double negative_slope() const { return slope_; }  ///< the slope for x ≤ 0

 private:
  double slope_;
};

/// x where x > 0, else α·(exp(x) - 1), as torch.nn.ELU: any defined input, output of the same
/// shape. Gradient: g where x > 0, else g·α·exp(x).
class ELU : public Cloneable<ELU> {
 public:
  /// `alpha`: α; the output approaches -α as x goes to -∞.
  explicit ELU(double alpha = 1.0) : alpha_(alpha) {}
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "ELU"; }
  std::string extra_repr() const override;
  double alpha() const { return alpha_; }  ///< α

 private:
  double alpha_;
};

/// σ(x) = 1 / (1 + exp(-x)) elementwise, as torch.nn.Sigmoid: any defined input, output of the
/// same shape. Gradient: g·σ(x)·(1 - σ(x)).
class Sigmoid : public Cloneable<Sigmoid> {
 public:
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Sigmoid"; }
};

/// tanh(x) elementwise, as torch.nn.Tanh: any defined input, output of the same shape.
/// Gradient: g·(1 - tanh²(x)).
class Tanh : public Cloneable<Tanh> {
 public:
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Tanh"; }
};

/// log(1 + exp(β·x)) / β, linear where β·x > threshold.
/// As torch.nn.Softplus: any defined input, output of the same shape. Gradient: g·σ(β·x), and g
/// where β·x > threshold.
class Softplus : public Cloneable<Softplus> {
 public:
  /// `beta`: β, positive (else ef::Error). `threshold`: where β·x exceeds it, the output is x.
  explicit Softplus(double beta = 1.0, double threshold = 20.0);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Softplus"; }
  std::string extra_repr() const override;
  double beta() const { return beta_; }            ///< β
  double threshold() const { return threshold_; }  ///< where the output becomes linear

 private:
  double beta_, threshold_;
};

}  // namespace evenflow::nn
