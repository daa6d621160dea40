/// @file
/// Linear: y = x·Wᵀ + b over the last dim, as torch.nn.Linear (weight [out, in], bias [out]); and
/// Identity, as torch.nn.Identity.
#pragma once

#include "evenflow/layers/module.h"

namespace evenflow::nn {

class Linear : public Cloneable<Linear> {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, const ModuleOptions& o = {});

  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Linear"; }
  std::string extra_repr() const override;

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  Tensor weight() const { return param("weight"); }
  Tensor bias() const { return optional_param("bias"); }  // undefined without bias

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
