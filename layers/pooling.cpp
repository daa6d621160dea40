// Pooling and resampling layers (see pooling.h): argument checks, then the engine ops.
#include "evenflow/layers/pooling.h"

#include <algorithm>
#include <cmath>

namespace evenflow::nn {

namespace {

void check_pool_args(const char* layer, const Size2& kernel, const Size2& stride, const Size2& padding) {
  util::check_positive(layer, "kernel_size", kernel);
  util::check_positive(layer, "stride", stride);
  util::check_non_negative(layer, "padding", padding);
  EF_CHECK(padding.h * 2 <= kernel.h && padding.w * 2 <= kernel.w, layer, ": padding ", padding.str(),
           " must be at most half of kernel_size ", kernel.str());
}

}  // namespace

// --- MaxPool2d --------------------------------------------------------------------------------------------

MaxPool2d::MaxPool2d(Size2 kernel_size, const MaxPool2dConfig& c)
    : kernel_(kernel_size), stride_(c.stride.value_or(kernel_size)), config_(c) {
  check_pool_args("MaxPool2d", kernel_, stride_, c.padding);
  util::check_positive("MaxPool2d", "dilation", c.dilation);
}

Tensor MaxPool2d::forward(const Tensor& x) {
  util::check_input_dims("MaxPool2d", x, 4, 4);
  return max_pool2d(x, {.kernel = kernel_.pair(),
                        .stride = stride_.pair(),
                        .padding = config_.padding.pair(),
                        .dilation = config_.dilation.pair(),
                        .ceil_mode = config_.ceil_mode});
}

std::string MaxPool2d::extra_repr() const {
  return evenflow::detail::str_cat("kernel_size=", kernel_.str(), ", stride=", stride_.str(),
                                   ", padding=", config_.padding.str(), ", dilation=", config_.dilation.str(),
                                   ", ceil_mode=", util::py_bool(config_.ceil_mode));
}

// --- AvgPool2d --------------------------------------------------------------------------------------------

AvgPool2d::AvgPool2d(Size2 kernel_size, const AvgPool2dConfig& c)
    : kernel_(kernel_size), stride_(c.stride.value_or(kernel_size)), config_(c) {
  check_pool_args("AvgPool2d", kernel_, stride_, c.padding);
}

Tensor AvgPool2d::forward(const Tensor& x) {
  util::check_input_dims("AvgPool2d", x, 4, 4);
  if (config_.ceil_mode) return ceil_mode_forward(x);
  return avg_pool2d(x, {.kernel = kernel_.pair(),
                        .stride = stride_.pair(),
                        .padding = config_.padding.pair(),
                        .count_include_pad = config_.count_include_pad});
}

// Note [AvgPool2d ceil_mode]
// The engine's avg_pool2d has no ceil_mode, so the layer builds it from differentiable ops: pad
// the input with zeros on every side (padding) and on the bottom / right (the partial last
// windows that ceil_mode adds), sum each window with avg_pool2d, and divide by PyTorch's divisor,
// a constant: the window's size clipped to the padded input when count_include_pad, else the
// number of input elements it covers. Output sizes follow PyTorch's pooling_output_shape: a last
// window must start inside the input or its left padding.
Tensor AvgPool2d::ceil_mode_forward(const Tensor& x) const {
  const auto out_and_extra = [](int64_t in, int64_t k, int64_t s, int64_t p) {
    int64_t out = (in + 2 * p - k + s - 1) / s + 1;
    if ((out - 1) * s >= in + p) --out;
    return std::pair{out, std::max<int64_t>(0, (out - 1) * s + k - (in + 2 * p))};
  };
  const int64_t ph = config_.padding.h, pw = config_.padding.w;
  EF_CHECK(x.size(2) + 2 * ph >= kernel_.h && x.size(3) + 2 * pw >= kernel_.w, "AvgPool2d: input shape ",
           shape_str(x.shape()), " is smaller than kernel_size ", kernel_.str());
  const auto [oh, extra_h] = out_and_extra(x.size(2), kernel_.h, stride_.h, ph);
  const auto [ow, extra_w] = out_and_extra(x.size(3), kernel_.w, stride_.w, pw);
  const std::vector<int64_t> pads{pw, pw + extra_w, ph, ph + extra_h};
  const Pool2dOptions window{.kernel = kernel_.pair(), .stride = stride_.pair()};
  const double area = static_cast<double>(kernel_.h * kernel_.w);
  Tensor divisor;
  {
    NoGradGuard no_grad;
    const TensorOptions like{.dtype = x.dtype(), .device = x.device()};
    // 1 where an element counts: the input, and its padding too when count_include_pad.
    const Tensor counted = config_.count_include_pad ? pad(ones({1, 1, x.size(2) + 2 * ph, x.size(3) + 2 * pw}, like),
                                                           {0, extra_w, 0, extra_h})
                                                     : pad(ones({1, 1, x.size(2), x.size(3)}, like), pads);
    divisor = avg_pool2d(counted, window) * area;
  }
  const Tensor sums = avg_pool2d(pad(x, pads), window) * area;
  EF_ASSERT(sums.size(2) == oh && sums.size(3) == ow, "AvgPool2d: ceil_mode output ", shape_str(sums.shape()),
            ", expected [", oh, ", ", ow, "]");
  return sums / divisor;
}

std::string AvgPool2d::extra_repr() const {
  return evenflow::detail::str_cat("kernel_size=", kernel_.str(), ", stride=", stride_.str(),
                                   ", padding=", config_.padding.str());
}

// --- ResamplingOperands -----------------------------------------------------------------------------------

const Resampling& ResamplingOperands::of(ResampleMode mode, const Tensor& x, std::pair<int64_t, int64_t> out) {
  const std::string key =
      evenflow::detail::str_cat(static_cast<int>(mode), " ", x.size(2), "x", x.size(3), " ", out.first, "x", out.second,
                                " ", dtype_name(x.dtype()), " ", x.device().str());
  auto it = made_.find(key);
  if (it == made_.end()) {
    it = made_.emplace(key, resampling(mode, {x.size(2), x.size(3)}, out, {.dtype = x.dtype(), .device = x.device()}))
             .first;
  }
  return it->second;
}

// --- AdaptiveAvgPool2d ------------------------------------------------------------------------------------

AdaptiveAvgPool2d::AdaptiveAvgPool2d(Size2 output_size) : output_size_(output_size) {
  util::check_positive("AdaptiveAvgPool2d", "output_size", output_size);
}

Tensor AdaptiveAvgPool2d::forward(const Tensor& x) {
  util::check_input_dims("AdaptiveAvgPool2d", x, 4, 4);
  EF_CHECK(x.size(2) >= 1 && x.size(3) >= 1, "AdaptiveAvgPool2d: input has an empty spatial dim ",
           shape_str(x.shape()));
  return resample2d(x, operands_.of(ResampleMode::AdaptiveAverage, x, output_size_.pair()));
}

std::string AdaptiveAvgPool2d::extra_repr() const {
  return "output_size=" + output_size_.str();
}

// --- Upsample ---------------------------------------------------------------------------------------------

Upsample::Upsample(const UpsampleConfig& c) : config_(c) {
  EF_CHECK(c.size.has_value() != c.scale_factor.has_value(), "Upsample: give exactly one of size and scale_factor");
  if (c.size) util::check_positive("Upsample", "size", *c.size);
  if (c.scale_factor)
    EF_CHECK(c.scale_factor->h > 0 && c.scale_factor->w > 0, "Upsample: scale_factor must be positive, got (",
             c.scale_factor->h, ", ", c.scale_factor->w, ")");
  EF_CHECK(!c.align_corners || c.mode == UpsampleMode::Bilinear,
           "Upsample: align_corners applies to bilinear mode only");
}

Tensor Upsample::forward(const Tensor& x) {
  util::check_input_dims("Upsample", x, 4, 4);
  std::pair<int64_t, int64_t> out;
  if (config_.size) {
    out = config_.size->pair();
  } else {  // Note [Upsample scale factors]
    const double sh = config_.scale_factor->h, sw = config_.scale_factor->w;
    out = {static_cast<int64_t>(std::floor(static_cast<double>(x.size(2)) * sh)),
           static_cast<int64_t>(std::floor(static_cast<double>(x.size(3)) * sw))};
    EF_CHECK(out.first > 0 && out.second > 0, "Upsample: scale_factor (", sh, ", ", sw, ") turns input shape ",
             shape_str(x.shape()), " into an empty output");
  }
  EF_CHECK(x.size(2) >= 1 && x.size(3) >= 1, "Upsample: input has an empty spatial dim ", shape_str(x.shape()));
  const ResampleMode mode = config_.mode == UpsampleMode::Nearest ? ResampleMode::Nearest
                            : config_.align_corners               ? ResampleMode::BilinearAlignCorners
                                                                  : ResampleMode::Bilinear;
  return resample2d(x, operands_.of(mode, x, out));
}

std::string Upsample::extra_repr() const {
  const char* mode = config_.mode == UpsampleMode::Nearest ? "nearest" : "bilinear";
  if (config_.size) return evenflow::detail::str_cat("size=", config_.size->str(), ", mode=", mode);
  const Scale2& f = *config_.scale_factor;
  if (f.single) return evenflow::detail::str_cat("scale_factor=", util::py_float(f.h), ", mode=", mode);
  return evenflow::detail::str_cat("scale_factor=(", util::py_float(f.h), ", ", util::py_float(f.w), "), mode=", mode);
}

}  // namespace evenflow::nn
