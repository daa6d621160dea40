/// @file
/// Linear: y = x·Wᵀ + b over the last dim, as torch.nn.Linear (weight [out, in], bias [out]); and
/// Identity, as torch.nn.Identity.
#pragma once

#include "evenflow/layers/module.h"

namespace evenflow::nn {

/// y = x·Wᵀ + b: x [..., in_features] (float32 or float64, the parameters' dtype and device, else
/// ef::Error) gives [..., out_features]. Gradient: dx = g·W, dW = gᵀ·x, db = Σg (over the batch
/// dims).
class Linear : public Cloneable<Linear> {
 public:
  /// Creates weight [out_features, in_features] and, if `bias`, bias [out_features], both
  /// initialised uniform(±1/√in_features) (0 when in_features is 0). Throws ef::Error when a size
  /// is negative.
  Linear(int64_t in_features, int64_t out_features, bool bias = true, const ModuleOptions& o = {});

  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Linear"; }
  std::string extra_repr() const override;

  int64_t in_features() const { return in_; }             ///< the size of the input's last dim
  int64_t out_features() const { return out_; }           ///< the size of the output's last dim
  Tensor weight() const { return param("weight"); }       ///< [out_features, in_features]
  Tensor bias() const { return optional_param("bias"); }  ///< [out_features]; undefined without bias

 private:
  int64_t in_, out_;
};

/// Returns its input, unchanged and differentiable as it is: a placeholder where a model takes a
/// layer or none (a critic's normalization "none"). No parameters.
class Identity : public Cloneable<Identity> {
 public:
  Tensor forward(const Tensor& x) override { return x; }
  std::string name() const override { return "Identity"; }
};

}  // namespace evenflow::nn
