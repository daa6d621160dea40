// Pooling and resampling: max pooling (a fused kernel whose backward is an op with its own
// backward); average pooling (a depthwise conv2d), adaptive average pooling and bilinear upsampling
// (products with constant matrices) and nearest upsampling (index_select), composites closed under
// differentiation by construction.
#include "evenflow/engine/ops.h"

#include <algorithm>
#include <cmath>

#include "evenflow/engine/ops_internal.h"

namespace evenflow {

using detail::backend_of;
using detail::Grads;

// --- Pooling and resampling ------------------------------------------------------------------------------

namespace {

int64_t pooled_size(const char* op, int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil_mode) {
  EF_CHECK(k >= 1 && s >= 1 && d >= 1 && p >= 0, op,
           ": kernel, stride and dilation must be positive, padding non-negative");
  const int64_t eff = d * (k - 1) + 1;
  EF_CHECK(2 * p <= eff, op, ": padding ", p, " must be at most half the kernel size ", eff);
  const int64_t span = in + 2 * p - eff;
  EF_CHECK(span >= 0, op, ": input size ", in, " (padded ", in + 2 * p, ") is smaller than the kernel ", eff);
  int64_t out = (ceil_mode ? (span + s - 1) / s : span / s) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;  // the last window must start inside the input
  return out;
}

}  // namespace

// The gradient goes to each window's argmax (a scatter_add over the flattened planes, in one kernel
// that zeroes and scatters a plane at a time); its own derivative gathers with the same indices.
static Tensor max_pool2d_backward(const Tensor& gy, const Tensor& idx, const PoolArgs& a) {
  Tensor gx = detail::empty_like_shape(gy, {a.n, a.c, a.h, a.w});
  if (gx.numel() > 0) backend_of(gy).max_pool2d_backward(a, gx.view(), gy.contiguous().view(), idx.view());
  record("max_pool2d_backward", {gx}, {gy}, {}, [idx, a](const Grads& g) {
    const Tensor flat = gather(reshape(g[0], {a.n, a.c, a.h * a.w}), 2, reshape(idx, {a.n, a.c, a.oh * a.ow}));
    return Grads{reshape(flat, {a.n, a.c, a.oh, a.ow})};
  });
  return gx;
}

Tensor max_pool2d(const Tensor& x, const Pool2dOptions& o) {
  detail::check_float("max_pool2d", x);
  EF_CHECK(x.dim() == 4, "max_pool2d: input must be 4-D [N, C, H, W], got ", shape_str(x.shape()));
  const auto stride = o.stride.value_or(o.kernel);
  PoolArgs a;
  a.n = x.size(0);
  a.c = x.size(1);
  a.h = x.size(2);
  a.w = x.size(3);
  a.kh = o.kernel.first;
  a.kw = o.kernel.second;
  a.stride_h = stride.first;
  a.stride_w = stride.second;
  a.pad_h = o.padding.first;
  a.pad_w = o.padding.second;
  a.dil_h = o.dilation.first;
  a.dil_w = o.dilation.second;
  a.oh = pooled_size("max_pool2d", a.h, a.kh, a.stride_h, a.pad_h, a.dil_h, o.ceil_mode);
  a.ow = pooled_size("max_pool2d", a.w, a.kw, a.stride_w, a.pad_w, a.dil_w, o.ceil_mode);
  Tensor y = detail::empty_like_shape(x, {a.n, a.c, a.oh, a.ow});
  Tensor idx = empty({a.n, a.c, a.oh, a.ow}, {.dtype = kInt64, .device = x.device()});
  if (y.numel() > 0) backend_of(x).max_pool2d(a, y.view(), idx.view(), x.contiguous().view());
  record("max_pool2d", {y}, {x}, {}, [idx, a](const Grads& g) { return Grads{max_pool2d_backward(g[0], idx, a)}; });
  return y;
}

Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& o) {
  detail::check_float("avg_pool2d", x);
  EF_CHECK(x.dim() == 4, "avg_pool2d: input must be 4-D [N, C, H, W], got ", shape_str(x.shape()));
  EF_CHECK(!o.ceil_mode, "avg_pool2d: ceil_mode is not supported");
  EF_CHECK(o.dilation.first == 1 && o.dilation.second == 1, "avg_pool2d: dilation is not supported");
  const auto stride = o.stride.value_or(o.kernel);
  pooled_size("avg_pool2d", x.size(2), o.kernel.first, stride.first, o.padding.first, 1, false);
  pooled_size("avg_pool2d", x.size(3), o.kernel.second, stride.second, o.padding.second, 1, false);
  // A window average is a depthwise convolution with a constant kernel: it inherits conv2d's
  // derivatives of every order.
  const int64_t n = x.size(0), c = x.size(1);
  const Conv2dOptions co{.stride = stride, .padding = o.padding};
  const Tensor ones_kernel = ones({1, 1, o.kernel.first, o.kernel.second}, detail::options_of(x));
  const Tensor sums = conv2d(reshape(x, {n * c, 1, x.size(2), x.size(3)}), ones_kernel, Tensor(), co);
  Tensor avg;
  if (o.count_include_pad || (o.padding.first == 0 && o.padding.second == 0)) {
    avg = mul_scalar(sums, 1.0 / static_cast<double>(o.kernel.first * o.kernel.second));
  } else {
    Tensor counts;
    {
      NoGradGuard no_grad;
      counts = conv2d(ones({1, 1, x.size(2), x.size(3)}, detail::options_of(x)), ones_kernel, Tensor(), co);
    }
    avg = sums / counts;
  }
  return reshape(avg, {n, c, avg.size(2), avg.size(3)});
}

namespace {

Tensor adaptive_matrix(int64_t out, int64_t in, const TensorOptions& opts) {
  std::vector<double> m(static_cast<size_t>(out * in), 0.0);
  for (int64_t i = 0; i < out; ++i) {
    const int64_t start = (i * in) / out, end = ((i + 1) * in + out - 1) / out;
    for (int64_t j = start; j < end; ++j) m[static_cast<size_t>(i * in + j)] = 1.0 / static_cast<double>(end - start);
  }
  return from_vector(m, {out, in}, opts);
}

// PyTorch's source coordinates: align_corners maps the corner pixels' centres onto each other;
// otherwise pixel centres are scaled by in/out and clamped at 0.
Tensor bilinear_matrix(int64_t out, int64_t in, bool align_corners, const TensorOptions& opts) {
  std::vector<double> m(static_cast<size_t>(out * in), 0.0);
  for (int64_t i = 0; i < out; ++i) {
    double src;
    if (align_corners)
      src = out > 1 ? static_cast<double>(i) * static_cast<double>(in - 1) / static_cast<double>(out - 1) : 0.0;
    else
      src = std::max((static_cast<double>(i) + 0.5) * static_cast<double>(in) / static_cast<double>(out) - 0.5, 0.0);
    const int64_t i0 = std::min<int64_t>(static_cast<int64_t>(std::floor(src)), in - 1);
    const int64_t i1 = std::min<int64_t>(i0 + 1, in - 1);
    const double l = src - static_cast<double>(i0);
    m[static_cast<size_t>(i * in + i0)] += 1.0 - l;
    m[static_cast<size_t>(i * in + i1)] += l;
  }
  return from_vector(m, {out, in}, opts);
}

// The source of each output pixel along one dim.
Tensor nearest_index(int64_t out, int64_t in, const Device& device) {
  std::vector<int64_t> idx(static_cast<size_t>(out));
  for (int64_t i = 0; i < out; ++i)
    idx[static_cast<size_t>(i)] = std::min<int64_t>(
        static_cast<int64_t>(std::floor(static_cast<double>(i) * static_cast<double>(in) / static_cast<double>(out))),
        in - 1);
  return from_int_vector(idx, {out}, device);
}

void check_resample(const char* op, const Tensor& x, std::pair<int64_t, int64_t> size) {
  detail::check_float(op, x);
  EF_CHECK(x.dim() == 4, op, ": input must be 4-D [N, C, H, W], got ", shape_str(x.shape()));
  EF_CHECK(size.first >= 1 && size.second >= 1, op, ": output size must be positive, got ", size.first, "x",
           size.second);
  EF_CHECK(x.size(2) >= 1 && x.size(3) >= 1, op, ": input has an empty spatial dim ", shape_str(x.shape()));
}

std::pair<int64_t, int64_t> spatial(const Tensor& x) {
  return {x.size(2), x.size(3)};
}

}  // namespace

Resampling resampling(ResampleMode mode, std::pair<int64_t, int64_t> in, std::pair<int64_t, int64_t> out,
                      const TensorOptions& opts) {
  EF_CHECK(in.first >= 1 && in.second >= 1 && out.first >= 1 && out.second >= 1,
           "resampling: sizes must be positive, got ", in.first, "x", in.second, " to ", out.first, "x", out.second);
  switch (mode) {
    case ResampleMode::Nearest:
      return {nearest_index(out.first, in.first, opts.device), nearest_index(out.second, in.second, opts.device), in};
    case ResampleMode::AdaptiveAverage:
      return {adaptive_matrix(out.first, in.first, opts), adaptive_matrix(out.second, in.second, opts), in};
    case ResampleMode::Bilinear:
    case ResampleMode::BilinearAlignCorners: {
      const bool align = mode == ResampleMode::BilinearAlignCorners;
      return {bilinear_matrix(out.first, in.first, align, opts), bilinear_matrix(out.second, in.second, align, opts),
              in};
    }
  }
  EF_ERROR("resampling: unknown mode ", static_cast<int>(mode));
}

Tensor resample2d(const Tensor& x, const Resampling& r) {
  detail::check_float("resample2d", x);
  EF_CHECK(x.dim() == 4, "resample2d: input must be 4-D [N, C, H, W], got ", shape_str(x.shape()));
  EF_CHECK(r.rows.defined() && r.cols.defined() && r.rows.dtype() == r.cols.dtype(),
           "resample2d: the operands are undefined or of two dtypes (make them with resampling())");
  EF_CHECK(r.rows.device() == x.device() && r.cols.device() == x.device(), "resample2d: operands on ",
           r.rows.device().str(), ", input on ", x.device().str());
  EF_CHECK(r.in == spatial(x), "resample2d: operands made for ", r.in.first, "x", r.in.second, ", input ",
           shape_str(x.shape()));
  if (r.rows.dtype() == kInt64) {  // nearest: the source rows, then columns
    EF_CHECK(r.rows.dim() == 1 && r.cols.dim() == 1, "resample2d: nearest operands must be 1-D, got ",
             shape_str(r.rows.shape()), " and ", shape_str(r.cols.shape()));
    return index_select(index_select(x, 2, r.rows), 3, r.cols);
  }
  EF_CHECK(r.rows.dtype() == x.dtype(), "resample2d: operands of ", dtype_name(r.rows.dtype()), " for an input of ",
           dtype_name(x.dtype()));
  EF_CHECK(r.rows.dim() == 2 && r.cols.dim() == 2 && r.rows.size(1) == x.size(2) && r.cols.size(1) == x.size(3),
           "resample2d: operands ", shape_str(r.rows.shape()), " and ", shape_str(r.cols.shape()),
           " are not matrices for input ", shape_str(x.shape()));
  // rows·x·colsᵀ over the last two dims: [OH,H] x [N,C,H,W] x [W,OW].
  return matmul(matmul(r.rows, x), transpose(r.cols, 0, 1));
}

Tensor adaptive_avg_pool2d(const Tensor& x, std::pair<int64_t, int64_t> size) {
  check_resample("adaptive_avg_pool2d", x, size);
  return resample2d(x, resampling(ResampleMode::AdaptiveAverage, spatial(x), size, detail::options_of(x)));
}

Tensor upsample_bilinear2d(const Tensor& x, std::pair<int64_t, int64_t> size, bool align_corners) {
  check_resample("upsample_bilinear2d", x, size);
  const ResampleMode mode = align_corners ? ResampleMode::BilinearAlignCorners : ResampleMode::Bilinear;
  return resample2d(x, resampling(mode, spatial(x), size, detail::options_of(x)));
}

Tensor upsample_nearest2d(const Tensor& x, std::pair<int64_t, int64_t> size) {
  check_resample("upsample_nearest2d", x, size);
  return resample2d(x, resampling(ResampleMode::Nearest, spatial(x), size, detail::options_of(x)));
}

}  // namespace evenflow
