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
  int64_t in_channels() const { return in_; }
  int64_t out_channels() const { return out_; }
  Size2 kernel_size() const { return kernel_; }
  Tensor weight() const { return param("weight"); }
  Tensor bias() const { return optional_param("bias"); }  // undefined without bias

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

struct Conv2dConfig {
  Size2 stride = 1, padding = 0, dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};

class Conv2d : public Cloneable<Conv2d, ConvBase> {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, const Conv2dConfig& c = {},
         const ModuleOptions& o = {});

  Tensor forward(const Tensor& x) override;  ///< x [N, in, H, W]
  std::string name() const override { return "Conv2d"; }
  std::string extra_repr() const override;
  const Conv2dConfig& config() const { return config_; }

 private:
  Conv2dConfig config_;
};

struct ConvTranspose2dConfig {
  Size2 stride = 1, padding = 0, output_padding = 0, dilation = 1;
  int64_t groups = 1;
  bool bias = true;
};

class ConvTranspose2d : public Cloneable<ConvTranspose2d, ConvBase> {
 public:
  ConvTranspose2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, const ConvTranspose2dConfig& c = {},
                  const ModuleOptions& o = {});

  Tensor forward(const Tensor& x) override;  ///< x [N, in, H, W]
  std::string name() const override { return "ConvTranspose2d"; }
  std::string extra_repr() const override;
  const ConvTranspose2dConfig& config() const { return config_; }

 private:
  ConvTranspose2dConfig config_;
};

}  // namespace evenflow::nn
