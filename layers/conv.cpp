// Conv2d and ConvTranspose2d (see conv.h): argument checks, PyTorch's initialisation, then the
// engine's conv2d / conv_transpose2d.
#include "evenflow/layers/conv.h"

#include "evenflow/layers/init.h"

namespace evenflow::nn {

namespace {

// The memory format a layer's channels_last setting asks of its op.
MemoryFormat activation_format(bool channels_last) {
  return channels_last ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
}

void check_geometry(const char* layer, const Size2& stride, const Size2& padding, const Size2& dilation) {
  util::check_positive(layer, "stride", stride);
  util::check_non_negative(layer, "padding", padding);
  util::check_positive(layer, "dilation", dilation);
}

}  // namespace

// --- ConvBase ---------------------------------------------------------------------------------------------

ConvBase::ConvBase(const char* layer, int64_t in_channels, int64_t out_channels, Size2 kernel_size, int64_t groups,
                   bool bias, bool transposed, const ModuleOptions& o)
    : layer_(layer), in_(in_channels), out_(out_channels), kernel_(kernel_size) {
  util::check_positive(layer, "in_channels", in_);
  util::check_positive(layer, "out_channels", out_);
  util::check_positive(layer, "kernel_size", kernel_);
  util::check_positive(layer, "groups", groups);
  EF_CHECK(in_ % groups == 0, layer, ": in_channels ", in_, " is not divisible by groups ", groups);
  EF_CHECK(out_ % groups == 0, layer, ": out_channels ", out_, " is not divisible by groups ", groups);
  const Shape weight_shape =
      transposed ? Shape{in_, out_ / groups, kernel_.h, kernel_.w} : Shape{out_, in_ / groups, kernel_.h, kernel_.w};
  register_parameter("weight", empty(weight_shape, o.tensor_options()));
  const int64_t fan_in = init::fan_in(weight_shape);
  init::default_uniform_(weight(), fan_in);
  if (bias) {
    register_parameter("bias", empty({out_}, o.tensor_options()));
    init::default_uniform_(this->bias(), fan_in);
  }
}

void ConvBase::check_input(const Tensor& x) const {
  util::check_input_dims(layer_, x, 4, 4);
  EF_CHECK(x.size(1) == in_, layer_, ": input has ", x.size(1), " channels, expected ", in_, " (input shape ",
           shape_str(x.shape()), ")");
  check_input_matches_params(x);
}

std::string ConvBase::conv_repr(const Size2& stride, const Size2& padding, const Size2& dilation,
                                const Size2& output_padding, int64_t groups) const {
  std::string s = evenflow::detail::str_cat(in_, ", ", out_, ", kernel_size=", kernel_.tuple_str(),
                                            ", stride=", stride.tuple_str());
  if (padding != Size2(0)) s += ", padding=" + padding.tuple_str();
  if (dilation != Size2(1)) s += ", dilation=" + dilation.tuple_str();
  if (output_padding != Size2(0)) s += ", output_padding=" + output_padding.tuple_str();
  if (groups != 1) s += ", groups=" + std::to_string(groups);
  if (!bias().defined()) s += ", bias=False";
  return s;
}

// --- Conv2d --------------------------------------------------------------------------------------------

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size, const Conv2dConfig& c,
               const ModuleOptions& o)
    : Cloneable("Conv2d", in_channels, out_channels, kernel_size, c.groups, c.bias, /*transposed=*/false, o),
      config_(c) {
  check_geometry("Conv2d", c.stride, c.padding, c.dilation);
}

Tensor Conv2d::forward(const Tensor& x) {
  check_input(x);
  return conv2d(x, weight(), bias(),
                {.stride = config_.stride.pair(),
                 .padding = config_.padding.pair(),
                 .dilation = config_.dilation.pair(),
                 .groups = config_.groups,
                 .compute = compute_dtype(),
                 .memory_format = activation_format(config_.channels_last)});
}

std::string Conv2d::extra_repr() const {
  return conv_repr(config_.stride, config_.padding, config_.dilation, 0, config_.groups);
}

// --- ConvTranspose2d ------------------------------------------------------------------------------------

ConvTranspose2d::ConvTranspose2d(int64_t in_channels, int64_t out_channels, Size2 kernel_size,
                                 const ConvTranspose2dConfig& c, const ModuleOptions& o)
    : Cloneable("ConvTranspose2d", in_channels, out_channels, kernel_size, c.groups, c.bias, /*transposed=*/true, o),
      config_(c) {
  check_geometry("ConvTranspose2d", c.stride, c.padding, c.dilation);
  util::check_non_negative("ConvTranspose2d", "output_padding", c.output_padding);
  EF_CHECK((c.output_padding.h < c.stride.h || c.output_padding.h < c.dilation.h) &&
               (c.output_padding.w < c.stride.w || c.output_padding.w < c.dilation.w),
           "ConvTranspose2d: output_padding ", c.output_padding.str(), " must be smaller than stride ", c.stride.str(),
           " or dilation ", c.dilation.str());
}

Tensor ConvTranspose2d::forward(const Tensor& x) {
  check_input(x);
  return conv_transpose2d(x, weight(), bias(),
                          {.stride = config_.stride.pair(),
                           .padding = config_.padding.pair(),
                           .output_padding = config_.output_padding.pair(),
                           .dilation = config_.dilation.pair(),
                           .groups = config_.groups,
                           .compute = compute_dtype(),
                           .memory_format = activation_format(config_.channels_last)});
}

std::string ConvTranspose2d::extra_repr() const {
  return conv_repr(config_.stride, config_.padding, config_.dilation, config_.output_padding, config_.groups);
}

}  // namespace evenflow::nn
