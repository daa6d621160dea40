/// @file
/// Dropout, as torch.nn.Dropout.
#pragma once

#include "evenflow/layers/module.h"

namespace evenflow::nn {

/// Training: zeroes each element with probability p (drawn from the input's device generator) and
/// scales the rest by 1/(1-p). Eval: the identity.
class Dropout : public Cloneable<Dropout> {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Dropout"; }
  std::string extra_repr() const override;
  double p() const { return p_; }

 private:
  double p_;
};

}  // namespace evenflow::nn
