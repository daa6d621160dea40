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

Tensor matrix_from(const std::vector<double>& values, int64_t rows, int64_t cols, const Tensor& like) {
  return from_vector(values, {rows, cols}, detail::options_of(like));
}

Tensor adaptive_matrix(int64_t out, int64_t in, const Tensor& like) {
  std::vector<double> m(static_cast<size_t>(out * in), 0.0);
  for (int64_t i = 0; i < out; ++i) {
    const int64_t start = (i * in) / out, end = ((i + 1) * in + out - 1) / out;
    for (int64_t j = start; j < end; ++j) m[static_cast<size_t>(i * in + j)] = 1.0 / static_cast<double>(end - start);
  }
  return matrix_from(m, out, in, like);
}

// PyTorch's source coordinates: align_corners maps the corner pixels' centres onto each other;
// otherwise pixel centres are scaled by in/out and clamped at 0.
Tensor bilinear_matrix(int64_t out, int64_t in, bool align_corners, const Tensor& like) {
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
  return matrix_from(m, out, in, like);
}

void check_resample(const char* op, const Tensor& x, std::pair<int64_t, int64_t> size) {
  detail::check_float(op, x);
  EF_CHECK(x.dim() == 4, op, ": input must be 4-D [N, C, H, W], got ", shape_str(x.shape()));
  EF_CHECK(size.first >= 1 && size.second >= 1, op, ": output size must be positive, got ", size.first, "x",
           size.second);
  EF_CHECK(x.size(2) >= 1 && x.size(3) >= 1, op, ": input has an empty spatial dim ", shape_str(x.shape()));
}

// rows·x·colsᵀ over the last two dims: [OH,H] x [N,C,H,W] x [W,OW].
Tensor separable(const Tensor& rows, const Tensor& x, const Tensor& cols) {
  return matmul(matmul(rows, x), transpose(cols, 0, 1));
}

}  // namespace

Tensor adaptive_avg_pool2d(const Tensor& x, std::pair<int64_t, int64_t> size) {
  check_resample("adaptive_avg_pool2d", x, size);
  return separable(adaptive_matrix(size.first, x.size(2), x), x, adaptive_matrix(size.second, x.size(3), x));
}

Tensor upsample_bilinear2d(const Tensor& x, std::pair<int64_t, int64_t> size, bool align_corners) {
  check_resample("upsample_bilinear2d", x, size);
  return separable(bilinear_matrix(size.first, x.size(2), align_corners, x), x,
                   bilinear_matrix(size.second, x.size(3), align_corners, x));
}

Tensor upsample_nearest2d(const Tensor& x, std::pair<int64_t, int64_t> size) {
  check_resample("upsample_nearest2d", x, size);
  auto nearest = [&](int64_t out, int64_t in) {
    std::vector<int64_t> idx(static_cast<size_t>(out));
    for (int64_t i = 0; i < out; ++i)
      idx[static_cast<size_t>(i)] = std::min<int64_t>(
          static_cast<int64_t>(std::floor(static_cast<double>(i) * static_cast<double>(in) / static_cast<double>(out))),
          in - 1);
    return from_int_vector(idx, {out}, x.device());
  };
  return index_select(index_select(x, 2, nearest(size.first, x.size(2))), 3, nearest(size.second, x.size(3)));
}

}  // namespace evenflow
