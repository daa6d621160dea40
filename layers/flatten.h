/// @file
/// Flatten, as torch.nn.Flatten.
#pragma once

#include "evenflow/layers/module.h"

namespace evenflow::nn {

/// Flattens dims start_dim..end_dim into one (default: all but the batch dim).
/// A reshape, so the gradient is g reshaped back to the input's shape.
class Flatten : public Cloneable<Flatten> {
 public:
  /// The first and last dims to merge, both included; negative counts from the end. They are
  /// checked against each input: forward() throws ef::Error unless both are dims of the input
  /// (a 0-d input counts as 1-d) and start_dim is not after end_dim.
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1) : start_(start_dim), end_(end_dim) {}
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Flatten"; }
  std::string extra_repr() const override;

 private:
  int64_t start_, end_;
};

}  // namespace evenflow::nn
