/// @file
/// Dropout, as torch.nn.Dropout.
#pragma once

#include "evenflow/layers/module.h"

namespace evenflow::nn {

/// Training: zeroes each element with probability p (drawn from the input's device generator) and
/// scales the rest by 1/(1-p). Eval: the identity.
/// Any defined float32 or float64 input; the output has its shape. p = 1 gives zeros; in eval, or
/// with p = 0, the output is the input tensor itself. Gradient: g times the same mask.
class Dropout : public Cloneable<Dropout> {
 public:
  /// `p`: the probability of zeroing an element, in [0, 1] (else ef::Error).
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Dropout"; }
  std::string extra_repr() const override;
  double p() const { return p_; }  ///< the probability of zeroing an element

 private:
  double p_;
};

}  // namespace evenflow::nn
