/// @file
/// Conv2d and ConvTranspose2d, as torch.nn: weights [out, in/groups, kh, kw] and
/// [in, out/groups, kh, kw] respectively, bias [out], zero padding.
#pragma once

#include "evenflow/layers/module.h"

namespace evenflow::nn {

/// What the two convolutions share (PyTorch's _ConvNd): channels, kernel, weight and bias, and
/// their initialisation, uniform(±1/√fan_in) with fan_in = weight.size(1)·kh·kw.
class ConvBase : public Module {
 public:
  int64_t in_channels() const { return in_; }    ///< the input's channel count
  int64_t out_channels() const { return out_; }  ///< the output's channel count
  Size2 kernel_size() const { return kernel_; }  ///< (kh, kw)
  /// The weight parameter (the module's own tensor): [out, in/groups, kh, kw] for Conv2d,
  /// [in, out/groups, kh, kw] for ConvTranspose2d.
  Tensor weight() const { return param("weight"); }
  Tensor bias() const { return optional_param("bias"); }  ///< [out]; undefined without bias

 protected:
  /// transposed: the weight is [in, out/groups, kh, kw] instead of [out, in/groups, kh, kw].
  ConvBase(const char* layer, int64_t in_channels, int64_t out_channels, Size2 kernel_size, int64_t groups, bool bias,
           bool transposed, const ModuleOptions& o);
  /// Raises ef::Error unless x is [N, in_channels, H, W] like the parameters.
  void check_input(const Tensor& x) const;
  /// PyTorch's repr: stride always, the rest when not at their defaults.
  std::string conv_repr(const Size2& stride, const Size2& padding, const Size2& dilation, const Size2& output_padding,
                        int64_t groups) const;

 private:
  const char* layer_;
  int64_t in_, out_;
  Size2 kernel_;
};

/// Conv2d's settings beyond channels and kernel size, with torch.nn.Conv2d's defaults.
struct Conv2dConfig {
  /// @var stride
  /// The window's step along H and W (positive).
  /// @var padding
  /// Zeros added on both sides of H and W (non-negative).
  /// @var dilation
  /// The spacing between kernel elements (positive; 1: adjacent).
  Size2 stride = 1, padding = 0, dilation = 1;
  int64_t groups = 1;  ///< channel groups, each convolved separately; divides both channel counts
  bool bias = true;    ///< whether the layer has a learnable bias
  /// The layer's output (and, in backward, its input's gradient) channels-last where the backend
  /// runs it so (oneDNN on CPUs: faster), else contiguous (Note [Channels-last] in engine/ops.h); the
  /// values are the same to rounding.
  bool channels_last = false;
};

/// A 2-d convolution (cross-correlation), as torch.nn.Conv2d: x [N, in, H, W] (float32 or float64,
/// the parameters' dtype and device, else ef::Error) gives [N, out, OH, OW] with
/// OH = ⌊(H + 2·padding - dilation·(kh - 1) - 1) / stride⌋ + 1, likewise OW; the padded input must
/// be at least as large as the dilated kernel. Differentiable (twice) with respect to the input,
/// weight and bias.
class Conv2d : public Cloneable<Conv2d, ConvBase> {
 public:
  /// Creates the weight and, if c.bias, the bias, initialised uniform(±1/√fan_in). Throws ef::Error
  /// when a channel count, kernel_size, groups, stride or dilation is not positive, padding is
  /// negative, or groups does not divide both channel counts.
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, const Conv2dConfig& c = {},
         const ModuleOptions& o = {});

  Tensor forward(const Tensor& x) override;  ///< x [N, in, H, W]
  std::string name() const override { return "Conv2d"; }
  std::string extra_repr() const override;
  const Conv2dConfig& config() const { return config_; }  ///< the settings it was built with

 private:
  Conv2dConfig config_;
};

/// ConvTranspose2d's settings beyond channels and kernel size, with torch.nn.ConvTranspose2d's
/// defaults.
struct ConvTranspose2dConfig {
  /// @var stride
  /// The step, in the output, between the windows of consecutive input elements (positive).
  /// @var padding
  /// Rows and columns removed from both sides of the output (non-negative).
  /// @var output_padding
  /// Rows and columns added to one side (bottom, right) of the output, to pick among the output
  /// sizes that a strided convolution maps to the same input size; non-negative and smaller than
  /// stride or dilation.
  /// @var dilation
  /// The spacing between kernel elements (positive; 1: adjacent).
  Size2 stride = 1, padding = 0, output_padding = 0, dilation = 1;
  int64_t groups = 1;  ///< channel groups, each convolved separately; divides both channel counts
  bool bias = true;    ///< whether the layer has a learnable bias
  /// As Conv2dConfig::channels_last: the output (and, in backward, the input's gradient)
  /// channels-last where the backend runs the pass so.
  bool channels_last = false;
};

/// A 2-d transposed convolution (the gradient of Conv2d with respect to its input), as
/// torch.nn.ConvTranspose2d: x [N, in, H, W] (float32 or float64, the parameters' dtype and
/// device, else ef::Error) gives [N, out, OH, OW] with
/// OH = (H - 1)·stride - 2·padding + dilation·(kh - 1) + output_padding + 1, likewise OW, which
/// must be positive. Differentiable (twice) with respect to the input, weight and bias.
class ConvTranspose2d : public Cloneable<ConvTranspose2d, ConvBase> {
 public:
  /// Creates the weight and, if c.bias, the bias, initialised uniform(±1/√fan_in) with
  /// fan_in = (out / groups)·kh·kw. Throws ef::Error when a channel count, kernel_size, groups,
  /// stride or dilation is not positive, padding or output_padding is negative, output_padding is
  /// not smaller than stride or dilation, or groups does not divide both channel counts.
  ConvTranspose2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, const ConvTranspose2dConfig& c = {},
                  const ModuleOptions& o = {});

  Tensor forward(const Tensor& x) override;  ///< x [N, in, H, W]
  std::string name() const override { return "ConvTranspose2d"; }
  std::string extra_repr() const override;
  const ConvTranspose2dConfig& config() const { return config_; }  ///< the settings it was built with

 private:
  ConvTranspose2dConfig config_;
};

}  // namespace evenflow::nn
