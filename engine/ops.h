/// @file
/// Every differentiable op of the engine, with its derivative in a one-line comment. Each op checks
/// its arguments (shapes, dtypes, devices: no implicit copies across devices or dtypes), runs a
/// backend kernel, and records a node whose backward is written in these same ops, so gradients can
/// be differentiated again (Note [Conv double backward] in ops.cpp shows the pattern for conv).
/// Ops marked "composite" are built from other ops and get their derivatives from them.
#pragma once

#include <optional>
#include <utility>
#include <vector>

#include "evenflow/engine/autograd.h"
#include "evenflow/engine/tensor.h"

namespace evenflow {

// The public differentiable ops. tests/engine/test_gradcheck.cpp holds one gradcheck entry per
// name and fails if a name here has none.
// clang-format off
#define EF_DIFFERENTIABLE_OPS(X)                                                                        \
  /* elementwise */ X(add) X(sub) X(mul) X(div) X(neg) X(add_scalar) X(mul_scalar) X(pow) X(sqrt)       \
  X(rsqrt) X(reciprocal) X(exp) X(log) X(abs) X(square) X(clamp) X(where) X(maximum) X(minimum)         \
  X(relu) X(leaky_relu) X(elu) X(sigmoid) X(tanh) X(softplus)                                           \
  /* reductions */ X(sum) X(mean) X(var) X(max) X(amax) X(norm) X(sum_to)                               \
  /* shape */ X(reshape) X(permute) X(transpose) X(slice) X(select) X(cat) X(stack) X(split) X(chunk)   \
  X(expand) X(flatten) X(squeeze) X(unsqueeze) X(pad)                                                   \
  /* copies */ X(clone) X(to_dtype) X(to_device)                                                        \
  /* linear algebra, convolution */ X(matmul) X(linear) X(conv2d) X(conv2d_input_grad)                  \
  X(conv2d_weight_grad) X(conv_transpose2d)                                                             \
  /* pooling, resampling */ X(max_pool2d) X(avg_pool2d) X(adaptive_avg_pool2d) X(upsample_bilinear2d)   \
  X(upsample_nearest2d)                                                                                 \
  /* softmax, indexing, dropout, normalization */ X(softmax) X(log_softmax) X(gather) X(scatter_add)    \
  X(index_select) X(index_add) X(dropout) X(batch_norm) X(layer_norm)
// clang-format on

/// --- Elementwise (broadcasting; both operands same dtype and device) ----------------------------
/// A NaN input gives a NaN output (Note [NaN propagation] in scalar_ops.h); where a backward masks,
/// it selects as PyTorch's does (Note [NaN in backward masks] in ops.cpp).
Tensor add(const Tensor& a, const Tensor& b);                        ///< d/da = g, d/db = g (summed to each shape)
Tensor sub(const Tensor& a, const Tensor& b);                        ///< d/da = g, d/db = -g
Tensor mul(const Tensor& a, const Tensor& b);                        ///< d/da = g·b, d/db = g·a
Tensor div(const Tensor& a, const Tensor& b);                        ///< d/da = g/b, d/db = -g·a/b²
Tensor neg(const Tensor& x);                                         ///< -g
Tensor add_scalar(const Tensor& x, double s);                        ///< g
Tensor mul_scalar(const Tensor& x, double s);                        ///< g·s
Tensor pow(const Tensor& x, double p);                               ///< g·p·x^(p-1)
Tensor sqrt(const Tensor& x);                                        ///< g·½·rsqrt(x)
Tensor rsqrt(const Tensor& x);                                       ///< g·(-½)·x^(-3/2)
Tensor reciprocal(const Tensor& x);                                  ///< -g·(1/x)²
Tensor exp(const Tensor& x);                                         ///< g·exp(x)
Tensor log(const Tensor& x);                                         ///< g/x
Tensor abs(const Tensor& x);                                         ///< g·sign(x)
Tensor square(const Tensor& x);                                      ///< g·2x
Tensor clamp(const Tensor& x, double lo, double hi);                 ///< g where lo ≤ x ≤ hi, else 0 (NaN x: 0)
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);  ///< a: where(c, g, 0), b: where(c, 0, g)
Tensor maximum(const Tensor& a, const Tensor& b);                    ///< g to the larger, ½ on ties, both if a NaN
Tensor minimum(const Tensor& a, const Tensor& b);                    ///< g to the smaller, ½ on ties, both if a NaN
Tensor relu(const Tensor& x);                                        ///< 0 where x ≤ 0, else g (NaN x: g)
Tensor leaky_relu(const Tensor& x, double slope = 0.01);             ///< g where x > 0, else slope·g (NaN x too)
Tensor elu(const Tensor& x, double alpha = 1.0);                     ///< g·α·exp(x) where x ≤ 0, else g (NaN x: g)
Tensor sigmoid(const Tensor& x);                                     ///< g·σ(x)·(1-σ(x))
Tensor tanh(const Tensor& x);                                        ///< g·(1-tanh²(x))
Tensor softplus(const Tensor& x, double beta = 1.0, double threshold = 20.0);  ///< g·σ(βx) (g where βx > threshold)

/// Not differentiable (their results never require grad): masks and comparisons, 1 or 0.
Tensor sign(const Tensor& x);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);

/// --- Reductions (dims may be negative; empty dims in sum/mean/var/norm = all dims) ---------------
Tensor sum(const Tensor& x);                                                                 ///< expand(g)
Tensor sum(const Tensor& x, const Shape& dims, bool keepdim = false);                        ///< expand(g)
Tensor mean(const Tensor& x);                                                                ///< composite
Tensor mean(const Tensor& x, const Shape& dims, bool keepdim = false);                       ///< composite
Tensor var(const Tensor& x, const Shape& dims, bool unbiased = true, bool keepdim = false);  ///< composite
/// Largest value along dim and its index (first on ties); the values are gather(x, dim, index).
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor amax(const Tensor& x);                                       ///< composite: max over all elements
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);  ///< int64, not differentiable
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor norm(const Tensor& x, double p = 2.0, const Shape& dims = {}, bool keepdim = false);  ///< composite
/// Sums x down to `shape` (the inverse of broadcasting): expand(g)
Tensor sum_to(const Tensor& x, const Shape& shape);

/// --- Shape ---------------------------------------------------------------------------------------
Tensor reshape(const Tensor& x, const Shape& shape);        ///< reshape(g); one dim may be -1; copies if needed
Tensor view(const Tensor& x, const Shape& shape);           ///< as reshape, but never copies
Tensor permute(const Tensor& x, const Shape& dims);         ///< permute(g, inverse)
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);  ///< composite (permute)
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);  ///< slice_backward(g)
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);                ///< composite (slice)
Tensor select(const Tensor& x, int64_t dim, int64_t index);                                ///< composite (slice, squeeze)
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);                                    ///< slices of g
Tensor stack(const std::vector<Tensor>& xs, int64_t dim);                                  ///< composite (unsqueeze, cat)
std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t dim);                     ///< composite (slice)
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim);       ///< composite (slice)
Tensor expand(const Tensor& x, const Shape& shape);                            ///< sum_to(g); -1 keeps a dim
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);  ///< composite (reshape)
Tensor squeeze(const Tensor& x, int64_t dim);                                  ///< composite (reshape)
Tensor unsqueeze(const Tensor& x, int64_t dim);                                ///< composite (reshape)
/// Constant padding; pads lists (before, after) pairs starting from the last dim, as torch.nn.functional.pad.
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, double value = 0.0);  ///< slices of g
Tensor slice_backward(const Tensor& g, const Shape& input_shape, int64_t dim, int64_t start, int64_t end,
                      int64_t step);  ///< d/dg = slice(gg)

/// --- Copies ----------------------------------------------------------------------------------------
Tensor clone(const Tensor& x);                       ///< g
Tensor to_dtype(const Tensor& x, DType t);           ///< g.to(x.dtype)
Tensor to_device(const Tensor& x, const Device& d);  ///< g.to(x.device)

/// --- Linear algebra and convolution -----------------------------------------------------------
/// [..., M, K] x [..., K, N] -> [..., M, N], batch dims broadcast.
Tensor matmul(const Tensor& a, const Tensor& b);  ///< dA = g·Bᵀ, dB = Aᵀ·g (summed to each shape)
/// x [..., in], weight [out, in], bias [out] (optional): x·Wᵀ + b.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());  ///< dx = g·W, dW = gᵀ·x, db = Σg

struct Conv2dOptions {
  std::pair<int64_t, int64_t> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
};
/// x [N, C, H, W], weight [O, C/groups, kh, kw], bias [O] (optional) -> [N, O, OH, OW].
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), const Conv2dOptions& o = {});
/// The gradient of conv2d with respect to its input / its weight, themselves ops (see the Note).
Tensor conv2d_input_grad(const Tensor& gy, const Tensor& weight, const Shape& input_shape, const Conv2dOptions& o);
Tensor conv2d_weight_grad(const Tensor& x, const Tensor& gy, const Shape& weight_shape, const Conv2dOptions& o);

struct ConvTranspose2dOptions {
  std::pair<int64_t, int64_t> stride{1, 1}, padding{0, 0}, output_padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
};
/// x [N, C, H, W], weight [C, O/groups, kh, kw] (PyTorch's layout): conv2d_input_grad in disguise.
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                        const ConvTranspose2dOptions& o = {});

/// --- Pooling, resampling -----------------------------------------------------------------------
struct Pool2dOptions {
  std::pair<int64_t, int64_t> kernel{2, 2};
  std::optional<std::pair<int64_t, int64_t>> stride = std::nullopt;  ///< default: kernel
  std::pair<int64_t, int64_t> padding{0, 0}, dilation{1, 1};
  bool ceil_mode = false;
  bool count_include_pad = true;  ///< avg_pool2d only
};
Tensor max_pool2d(const Tensor& x, const Pool2dOptions& o);                            ///< scatter_add of g at the argmax
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& o);                            ///< composite (depthwise conv2d)
Tensor adaptive_avg_pool2d(const Tensor& x, std::pair<int64_t, int64_t> output_size);  ///< composite (matmul)
Tensor upsample_bilinear2d(const Tensor& x, std::pair<int64_t, int64_t> output_size, bool align_corners);  ///< composite
Tensor upsample_nearest2d(const Tensor& x, std::pair<int64_t, int64_t> output_size);  ///< composite (index_select)

/// --- Softmax, indexing, dropout --------------------------------------------------------------------
Tensor softmax(const Tensor& x, int64_t dim);                      ///< y·(g - Σ g·y), y = softmax(x)
Tensor log_softmax(const Tensor& x, int64_t dim);                  ///< g - softmax(x)·Σ g
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);  ///< scatter_add(0, dim, index, g)
Tensor scatter_add(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src);  ///< base: g, src: gather(g)
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);  ///< index_add(0, dim, index, g)
Tensor index_add(const Tensor& base, int64_t dim, const Tensor& index,
                 const Tensor& src);  ///< base: g, src: index_select(g)
/// Zeroes elements with probability p and scales the rest by 1/(1-p); identity when !training.
Tensor dropout(const Tensor& x, double p, bool training);  ///< composite (mul by the mask)

/// --- Normalization (composite, so twice differentiable) ----------------------------------------
/// x [N, C, ...]. Training: normalizes with the batch's statistics and, if given, updates
/// running_mean / running_var in place (unbiased variance, PyTorch's momentum convention).
/// Eval: normalizes with the running statistics.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum = 0.1, double eps = 1e-5);
/// Normalizes over the last normalized_shape.size() dims.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);

/// --- In place (not differentiable; refused on tensors that require grad while grad mode is on) ----
void fill_(const Tensor& x, double v);
void copy_(const Tensor& dst, const Tensor& src);
void add_(const Tensor& x, const Tensor& other, double alpha = 1.0);
void mul_(const Tensor& x, double s);
/// One fused Adam/AdamW step (AdamArgs, engine/backend.h) on param, exp_avg, exp_avg_sq and, with
/// amsgrad, max_exp_avg_sq: one pass instead of ten kernels. All on one device, one dtype, one shape.
void adam_(const AdamArgs& args, const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
           const Tensor& exp_avg_sq, const Tensor& max_exp_avg_sq = Tensor());

/// --- Operators -------------------------------------------------------------------------------------
inline Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
inline Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
inline Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
inline Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
inline Tensor operator-(const Tensor& x) {
  return neg(x);
}
inline Tensor operator+(const Tensor& x, double s) {
  return add_scalar(x, s);
}
inline Tensor operator+(double s, const Tensor& x) {
  return add_scalar(x, s);
}
inline Tensor operator-(const Tensor& x, double s) {
  return add_scalar(x, -s);
}
inline Tensor operator-(double s, const Tensor& x) {
  return add_scalar(neg(x), s);
}
inline Tensor operator*(const Tensor& x, double s) {
  return mul_scalar(x, s);
}
inline Tensor operator*(double s, const Tensor& x) {
  return mul_scalar(x, s);
}
inline Tensor operator/(const Tensor& x, double s) {
  return mul_scalar(x, 1.0 / s);
}
inline Tensor operator/(double s, const Tensor& x) {
  return mul_scalar(reciprocal(x), s);
}

}  // namespace evenflow
