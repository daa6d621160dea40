/// @file
/// Pooling and resampling, as torch.nn: MaxPool2d, AvgPool2d, AdaptiveAvgPool2d, Upsample (nearest
/// or bilinear). Inputs are [N, C, H, W].
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>

#include "evenflow/layers/module.h"

namespace evenflow::nn {

/// MaxPool2d's settings beyond the kernel size, with torch.nn.MaxPool2d's defaults.
struct MaxPool2dConfig {
  std::optional<Size2> stride = std::nullopt;  ///< default: kernel_size
  /// @var padding
  /// Implicit padding on both sides of H and W, which never wins the max; non-negative and at most
  /// half of kernel_size.
  /// @var dilation
  /// The spacing between window elements (positive; 1: adjacent).
  Size2 padding = 0, dilation = 1;
  /// Rounds the output size up instead of down, adding a partial last window where it starts
  /// inside the input or its left padding.
  bool ceil_mode = false;
};

/// The maximum of each window, as torch.nn.MaxPool2d: x [N, C, H, W] (float32 or float64) gives
/// [N, C, OH, OW] with OH = ⌊(H + 2·padding - dilation·(kh - 1) - 1) / stride⌋ + 1 (rounded up
/// with ceil_mode), likewise OW. Gradient: g goes to the window's maximum element.
class MaxPool2d : public Cloneable<MaxPool2d> {
 public:
  /// Throws ef::Error when kernel_size, stride or dilation is not positive, or padding is negative
  /// or more than half of kernel_size.
  explicit MaxPool2d(Size2 kernel_size, const MaxPool2dConfig& c = {});
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "MaxPool2d"; }
  std::string extra_repr() const override;

 private:
  Size2 kernel_, stride_;
  MaxPool2dConfig config_;
};

/// AvgPool2d's settings beyond the kernel size, with torch.nn.AvgPool2d's defaults.
struct AvgPool2dConfig {
  std::optional<Size2> stride = std::nullopt;  ///< default: kernel_size
  Size2 padding = 0;  ///< zeros added on both sides of H and W; non-negative, at most half of kernel_size
  /// Rounds the output size up instead of down, adding a partial last window where it starts
  /// inside the input or its left padding; such a window's divisor counts only the elements inside
  /// the padded input (or, without count_include_pad, inside the input).
  bool ceil_mode = false;
  bool count_include_pad = true;  ///< padded zeros count in the divisor
};

/// The mean of each window, as torch.nn.AvgPool2d: x [N, C, H, W] (float32 or float64) gives
/// [N, C, OH, OW] with OH = ⌊(H + 2·padding - kh) / stride⌋ + 1 (rounded up with ceil_mode),
/// likewise OW. Differentiable with respect to x (a sum over each window divided by a constant).
class AvgPool2d : public Cloneable<AvgPool2d> {
 public:
  /// Throws ef::Error when kernel_size or stride is not positive, or padding is negative or more
  /// than half of kernel_size.
  explicit AvgPool2d(Size2 kernel_size, const AvgPool2dConfig& c = {});
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "AvgPool2d"; }
  std::string extra_repr() const override;

 private:
  Tensor ceil_mode_forward(const Tensor& x) const;  ///< Note [AvgPool2d ceil_mode]

  Size2 kernel_, stride_;
  AvgPool2dConfig config_;
};

/// The resampling operands (Resampling, engine/ops.h) a layer has made: one set per input size,
/// output size, dtype and device, made at the layer's first input of each and kept for the layer's
/// life, so that its forward copies nothing from the host after the first and a recorded step can
/// hold it (a recording uses them at their addresses). Part of AdaptiveAvgPool2d and Upsample.
class ResamplingOperands {
 public:
  /// The operands resizing x's last two dims to `out`.
  const Resampling& of(ResampleMode mode, const Tensor& x, std::pair<int64_t, int64_t> out);

 private:
  std::map<std::string, Resampling> made_;
};

/// Averages x [N, C, H, W] (float32 or float64) into [N, C, oh, ow] = output_size, as
/// torch.nn.AdaptiveAvgPool2d: output row i averages input rows ⌊i·H/oh⌋ to ⌈(i+1)·H/oh⌉ - 1, and
/// likewise for columns. Differentiable with respect to x.
class AdaptiveAvgPool2d : public Cloneable<AdaptiveAvgPool2d> {
 public:
  /// `output_size`: (oh, ow), positive (else ef::Error); `1` gives global average pooling.
  explicit AdaptiveAvgPool2d(Size2 output_size);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "AdaptiveAvgPool2d"; }
  std::string extra_repr() const override;

 private:
  Size2 output_size_;
  ResamplingOperands operands_;
};

/// How Upsample computes an output pixel. Nearest: output pixel i copies input pixel ⌊i·in/out⌋
/// along each dim, as PyTorch's "nearest". Bilinear: interpolates linearly between the two nearest
/// input pixels along each dim.
enum class UpsampleMode { Nearest, Bilinear };

/// A scale factor per spatial dim: `2.0` means {2.0, 2.0}.
struct Scale2 {
  /// @var h
  /// The factor for the height (dim 2).
  /// @var w
  /// The factor for the width (dim 3).
  double h = 1, w = 1;
  bool single = false;  ///< given as one number
  /// {both, both}, remembered as one number (PyTorch prints it so); implicit, so that
  /// `.scale_factor = 2.0` works.
  Scale2(double both) : h(both), w(both), single(true) {}  // NOLINT(google-explicit-constructor)
  /// {h_, w_}.
  Scale2(double h_, double w_) : h(h_), w(w_) {}
};

/// Upsample's settings: exactly one of size and scale_factor.
///
/// Note [Upsample scale factors]
/// With scale_factor the output size is floor(in·scale), as in PyTorch, and source coordinates are
/// mapped with in/out. PyTorch maps them with 1/scale instead (unless recompute_scale_factor=True);
/// the two agree whenever in·scale is a whole number (a scale of 2 always), which the constructor
/// does not require, so a fractional case follows recompute_scale_factor=True.
struct UpsampleConfig {
  std::optional<Size2> size = std::nullopt;           ///< the output size,
  std::optional<Scale2> scale_factor = std::nullopt;  ///< or the factor by which to scale H and W
  UpsampleMode mode = UpsampleMode::Nearest;          ///< nearest (the default) or bilinear interpolation
  bool align_corners = false;                         ///< bilinear only: corner pixels of input and output aligned
};

/// Resizes x [N, C, H, W] (float32 or float64) to [N, C, OH, OW], as torch.nn.Upsample: (OH, OW)
/// is the configured size, or (⌊H·scale.h⌋, ⌊W·scale.w⌋) (ef::Error when that is empty).
/// Differentiable with respect to x.
class Upsample : public Cloneable<Upsample> {
 public:
  /// Throws ef::Error unless exactly one of c.size and c.scale_factor is given, it is positive,
  /// and align_corners is set only with bilinear mode.
  explicit Upsample(const UpsampleConfig& c);
  Tensor forward(const Tensor& x) override;
  std::string name() const override { return "Upsample"; }
  std::string extra_repr() const override;

 private:
  UpsampleConfig config_;
  ResamplingOperands operands_;
};

}  // namespace evenflow::nn
