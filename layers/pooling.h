/// @file
/// Pooling and resampling, as torch.nn: MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, Upsample (nearest
/// or bilinear). Inputs are [N, C, H, W].
#pragma once

#include <optional>
#include <utility>

#include "evenflow/layers/module.h"

namespace evenflow::nn {

struct MaxPool2dConfig {
  std::optional<Size2> stride = std::nullopt;  ///< default: kernel_size
  Size2 padding = 0, dilation = 1;
  bool ceil_mode = false;
};

class MaxPool2d : public Cloneable<MaxPool2d> {
 public:
  explicit MaxPool2d(Size2 kernel_size, const MaxPool2dConfig& c = {});
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "MaxPool2d"; }
  std::string extra_repr() const override;

 private:
  Size2 kernel_, stride_;
  MaxPool2dConfig config_;
};

struct AvgPool2dConfig {
  std::optional<Size2> stride = std::nullopt;  ///< default: kernel_size
  Size2 padding = 0;
  bool ceil_mode = false;
  bool count_include_pad = true;  ///< padded zeros count in the divisor
};

class AvgPool2d : public Cloneable<AvgPool2d> {
 public:
  explicit AvgPool2d(Size2 kernel_size, const AvgPool2dConfig& c = {});
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "AvgPool2d"; }
  std::string extra_repr() const override;

 private:
  Tensor ceil_mode_forward(const Tensor& x) const;  ///< Note [AvgPool2d ceil_mode]

  Size2 kernel_, stride_;
  AvgPool2dConfig config_;
};

class AdaptiveAvgPool2d : public Cloneable<AdaptiveAvgPool2d> {
 public:
  explicit AdaptiveAvgPool2d(Size2 output_size);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "AdaptiveAvgPool2d"; }
  std::string extra_repr() const override;

 private:
  Size2 output_size_;
};

enum class UpsampleMode { Nearest, Bilinear };

/// A scale factor per spatial dim: `2.0` means {2.0, 2.0}.
struct Scale2 {
  double h = 1, w = 1;
  bool single = false;                                     ///< given as one number
  Scale2(double both) : h(both), w(both), single(true) {}  // NOLINT(google-explicit-constructor)
  Scale2(double h_, double w_) : h(h_), w(w_) {}
};

/// Note [Upsample scale factors]
/// With scale_factor the output size is floor(in·scale), as in PyTorch, and source coordinates are
/// mapped with in/out. PyTorch maps them with 1/scale instead (unless recompute_scale_factor=True);
/// the two agree whenever in·scale is a whole number (a scale of 2 always), which the constructor
/// does not require, so a fractional case follows recompute_scale_factor=True.
struct UpsampleConfig {
  std::optional<Size2> size = std::nullopt;           ///< the output size,
  std::optional<Scale2> scale_factor = std::nullopt;  ///< or the factor by which to scale H and W
  UpsampleMode mode = UpsampleMode::Nearest;
  bool align_corners = false;  ///< bilinear only: corner pixels of input and output aligned
};

class Upsample : public Cloneable<Upsample> {
 public:
  explicit Upsample(const UpsampleConfig& c);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Upsample"; }
  std::string extra_repr() const override;

 private:
  UpsampleConfig config_;
};

}  // namespace evenflow::nn
