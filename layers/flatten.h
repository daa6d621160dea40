/// @file
/// Flatten, as torch.nn.Flatten.
#pragma once

#include "evenflow/layers/module.h"

namespace evenflow::nn {

/// Flattens dims start_dim..end_dim into one (default: all but the batch dim).
class Flatten : public Cloneable<Flatten> {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1) : start_(start_dim), end_(end_dim) {}
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Flatten"; }
  std::string extra_repr() const override;

 private:
  int64_t start_, end_;
};

}  // namespace evenflow::nn
