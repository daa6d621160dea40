/// @file
/// Every differentiable op of the engine, each documented with its derivative ("Backward:", where g
/// is the gradient of the op's output). Each op checks its arguments (shapes, dtypes, devices: no
/// implicit copies across devices or dtypes) and throws ef::Error naming the op and what was wrong,
/// runs a backend kernel, and records a node whose backward is written in these same ops, so
/// gradients can be differentiated again (Note [Conv double backward] in ops/conv.cpp shows the
/// pattern for conv). Ops marked "composite" are built from other ops and get their derivatives
/// from them. Dims may be negative (counted from the end) wherever an op takes one.
///
/// Dtypes. Every op computes in float32 and float64 (int64 where it holds indices). bfloat16 is a
/// storage dtype: it takes to_dtype both ways (differentiable: the gradient is cast back, to any
/// order), copies, fills and device moves, and is read and written by io/safetensors.h (BF16);
/// every other op on a bfloat16 tensor throws ef::Error saying to cast it to float32. Matrix
/// products and convolutions compute in bfloat16 when asked (Note [bfloat16 compute]).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "evenflow/engine/autograd.h"
#include "evenflow/engine/tensor.h"

namespace evenflow {

/// The public differentiable ops, as an X-macro: `EF_DIFFERENTIABLE_OPS(X)` expands to `X(name)`
/// for each. tests/engine/test_gradcheck.cpp holds one gradcheck entry per name and fails if a name
/// here has none.
// clang-format off
#define EF_DIFFERENTIABLE_OPS(X)                                                                        \
  /* elementwise */ X(add) X(sub) X(mul) X(div) X(neg) X(add_scalar) X(mul_scalar) X(pow) X(sqrt)       \
  X(rsqrt) X(reciprocal) X(exp) X(log) X(abs) X(square) X(clamp) X(where) X(maximum) X(minimum)         \
  X(relu) X(leaky_relu) X(elu) X(sigmoid) X(tanh) X(erf) X(softplus)                                    \
  /* reductions */ X(sum) X(mean) X(var) X(max) X(amax) X(norm) X(sum_to)                               \
  /* shape */ X(reshape) X(permute) X(transpose) X(slice) X(select) X(cat) X(stack) X(split) X(chunk)   \
  X(expand) X(flatten) X(squeeze) X(unsqueeze) X(pad)                                                   \
  /* copies */ X(clone) X(contiguous) X(to_dtype) X(to_device)                                          \
  /* linear algebra, convolution */ X(matmul) X(linear) X(conv2d) X(conv2d_input_grad)                  \
  X(conv2d_weight_grad) X(conv_transpose2d)                                                             \
  /* pooling, resampling */ X(max_pool2d) X(avg_pool2d) X(adaptive_avg_pool2d) X(upsample_bilinear2d)   \
  X(upsample_nearest2d) X(resample2d)                                                                   \
  /* softmax, indexing, dropout, normalization */ X(softmax) X(log_softmax) X(gather) X(scatter_add)    \
  X(index_select) X(index_add) X(dropout) X(batch_norm) X(layer_norm)
// clang-format on

/// @name Elementwise
/// Broadcasting; both operands same dtype and device. The unary ops take float32 or float64.
/// A NaN input gives a NaN output (Note [NaN propagation] in scalar_ops.h); where a backward masks,
/// it selects as PyTorch's does (Note [NaN in backward masks] in ops/elementwise.cpp).
/// @{

/// Elementwise a + b, broadcasting. Backward: d/da = g, d/db = g (summed to each shape).
Tensor add(const Tensor& a, const Tensor& b);
/// Elementwise a - b, broadcasting. Backward: d/da = g, d/db = -g (summed to each shape).
Tensor sub(const Tensor& a, const Tensor& b);
/// Elementwise a·b, broadcasting. Backward: d/da = g·b, d/db = g·a (summed to each shape).
Tensor mul(const Tensor& a, const Tensor& b);
/// Elementwise a / b, broadcasting. Backward: d/da = g/b, d/db = -g·a/b² (summed to each shape).
Tensor div(const Tensor& a, const Tensor& b);
/// -x. Backward: -g.
Tensor neg(const Tensor& x);
/// x + s. Backward: g.
Tensor add_scalar(const Tensor& x, double s);
/// x·s. Backward: g·s.
Tensor mul_scalar(const Tensor& x, double s);
/// x to the power p, elementwise (std::pow: a negative x with a non-integer p gives NaN).
/// Backward: g·p·x^(p-1).
Tensor pow(const Tensor& x, double p);
/// Square root (NaN for x < 0). Backward: g·½·rsqrt(x).
Tensor sqrt(const Tensor& x);
/// 1/√x. Backward: g·(-½)·x^(-3/2).
Tensor rsqrt(const Tensor& x);
/// 1/x. Backward: -g·(1/x)².
Tensor reciprocal(const Tensor& x);
/// eˣ. Backward: g·exp(x).
Tensor exp(const Tensor& x);
/// Natural logarithm. Backward: g/x.
Tensor log(const Tensor& x);
/// |x|. Backward: g·sign(x) (0 at x = 0).
Tensor abs(const Tensor& x);
/// x². Backward: g·2x.
Tensor square(const Tensor& x);
/// x limited to [lo, hi]; lo > hi throws. Backward: g where lo ≤ x ≤ hi, else 0 (NaN x: 0).
Tensor clamp(const Tensor& x, double lo, double hi);
/// a where cond is nonzero, else b; the three broadcast together. cond is a 1/0 mask of a's dtype
/// and device (as gt() and the other comparisons return) and gets no gradient.
/// Backward: a: where(c, g, 0), b: where(c, 0, g) (summed to each shape).
Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b);
/// The larger of a and b, broadcasting (NaN where either is NaN).
/// Backward: g to the larger, ½ on ties, both if a NaN.
Tensor maximum(const Tensor& a, const Tensor& b);
/// The smaller of a and b, broadcasting (NaN where either is NaN).
/// Backward: g to the smaller, ½ on ties, both if a NaN.
Tensor minimum(const Tensor& a, const Tensor& b);
/// max(x, 0) (PyTorch's threshold: x ≤ 0 ? 0 : x). Backward: 0 where x ≤ 0, else g (NaN x: g).
Tensor relu(const Tensor& x);
/// x where x > 0, else slope·x. Backward: g where x > 0, else slope·g (NaN x too).
Tensor leaky_relu(const Tensor& x, double slope = 0.01);
/// x where x > 0, else α·(exp(x) - 1), α = alpha. Backward: g·α·exp(x) where x ≤ 0, else g (NaN x:
/// g).
Tensor elu(const Tensor& x, double alpha = 1.0);
/// σ(x) = 1/(1 + exp(-x)), computed without overflow for either sign. Backward: g·σ(x)·(1-σ(x)).
Tensor sigmoid(const Tensor& x);
/// Hyperbolic tangent. Backward: g·(1-tanh²(x)).
Tensor tanh(const Tensor& x);
/// The error function erf(x) = 2/√π ∫₀ˣ e^{-t²} dt. Backward: g·2/√π·e^{-x²}.
Tensor erf(const Tensor& x);
/// log(1 + exp(βx))/β, β = beta, and x itself where βx > threshold (PyTorch's); beta must be
/// positive. Backward: g·σ(βx) (g where βx > threshold).
Tensor softplus(const Tensor& x, double beta = 1.0, double threshold = 20.0);
/// @}

/// @name Comparisons and sign (not differentiable)
/// Not differentiable (their results never require grad): masks and comparisons, 1 or 0, in the
/// operands' dtype; sign gives -1, 0 or 1. The comparisons broadcast and need operands of one dtype
/// and device; a comparison with NaN is false.
/// @{

/// -1, 0 or 1 by the sign of x (0 for NaN); x must be float32 or float64.
Tensor sign(const Tensor& x);
/// 1 where a > b, else 0.
Tensor gt(const Tensor& a, const Tensor& b);
/// 1 where a < b, else 0.
Tensor lt(const Tensor& a, const Tensor& b);
/// 1 where a ≥ b, else 0.
Tensor ge(const Tensor& a, const Tensor& b);
/// 1 where a ≤ b, else 0.
Tensor le(const Tensor& a, const Tensor& b);
/// 1 where a == b, else 0.
Tensor eq(const Tensor& a, const Tensor& b);
/// 1 where a != b, else 0 (1 where either is NaN).
Tensor ne(const Tensor& a, const Tensor& b);
/// @}

/// @name Reductions
/// Dims may be negative; empty dims in sum/mean/var/norm = all dims. A dim listed twice throws.
/// keepdim keeps each reduced dim with size 1; otherwise it is removed. Inputs are float32 or
/// float64.
/// @{

/// The sum of all elements, 0-d (0 for an empty x). Backward: expand(g).
Tensor sum(const Tensor& x);
/// The sum over dims (all if empty). Backward: expand(g).
Tensor sum(const Tensor& x, const Shape& dims, bool keepdim = false);
/// The mean of all elements, 0-d; an empty x throws. Composite (sum, mul_scalar).
Tensor mean(const Tensor& x);
/// The mean over dims (all if empty); an empty reduction throws. Composite (sum, mul_scalar).
Tensor mean(const Tensor& x, const Shape& dims, bool keepdim = false);
/// The variance over dims (all if empty): divided by n - 1 when unbiased (n ≥ 2 needed), else by n
/// (n ≥ 1), n being the number of elements reduced. Composite.
Tensor var(const Tensor& x, const Shape& dims, bool unbiased = true, bool keepdim = false);
/// Largest value along dim and its index (first on ties); the values are gather(x, dim, index).
/// Returns (values, int64 indices); NaN counts as the largest. A 0-d x gives (a copy of x, 0); an
/// empty x throws. Backward: g to the element at the index (gather's).
std::pair<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
/// The largest element, 0-d (NaN if x holds one); an empty x throws. Backward: g to the first
/// largest element (argmax of the flattened x, found in the forward only when x requires grad).
Tensor amax(const Tensor& x);
/// The index of the largest value along dim (first on ties; NaN counts as the largest). Int64, not
/// differentiable; x must be float32 or float64 and non-empty.
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
/// The index of the smallest value along dim (first on ties; NaN counts as the smallest). Int64,
/// not differentiable; x must be float32 or float64 and non-empty.
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);
/// The p-norm over dims (all if empty), (Σ|x|^p)^(1/p); p must be positive. Composite: p = 2 is
/// sqrt(sum(square(x))), p = 1 is sum(abs(x)). Where the norm is 0 its gradient is 0, as in PyTorch
/// (Note [Norm at zero] in ops/reduce.cpp; for p < 1 an element at 0 still has an infinite derivative).
Tensor norm(const Tensor& x, double p = 2.0, const Shape& dims = {}, bool keepdim = false);
/// Sums x down to `shape` (the inverse of broadcasting): expand(g). `shape` must broadcast to x's
/// shape, or it throws; x itself is returned when the shapes are equal.
Tensor sum_to(const Tensor& x, const Shape& shape);
/// @}

/// @name Shape
/// A view shares x's storage: writing to one (in place) changes the other.
/// @{

/// x with a new shape of the same element count; one dim may be -1 (inferred). A view of x when x
/// is contiguous, a copy if needed, x itself when the shape is unchanged. Backward: reshape(g).
Tensor reshape(const Tensor& x, const Shape& shape);
/// As reshape, but never copies: a non-contiguous x throws. Backward: reshape(g).
Tensor view(const Tensor& x, const Shape& shape);
/// A view with x's dims reordered: output dim i is x's dim dims[i] (dims a permutation of x's
/// dims). Backward: permute(g, inverse).
Tensor permute(const Tensor& x, const Shape& dims);
/// A view with dims d0 and d1 swapped. Composite (permute).
Tensor transpose(const Tensor& x, int64_t d0, int64_t d1);
/// A view of x[start:end:step] along dim, with Python's bounds: negative start/end count from the
/// end, out-of-range bounds are clamped. step must be positive; a 0-d x throws.
/// Backward: slice_backward(g).
Tensor slice(const Tensor& x, int64_t dim, int64_t start, int64_t end, int64_t step = 1);
/// A view of `length` elements of dim from start (negative start counts from the end); a range
/// outside the dim throws. Composite (slice).
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
/// A view of entry `index` of dim, that dim removed (negative index counts from the end; out of
/// range throws). Composite (slice, squeeze).
Tensor select(const Tensor& x, int64_t dim, int64_t index);
/// Concatenates xs along dim into a new tensor. xs is non-empty, of one dtype and device, each with
/// the same number of dims (at least 1) and the same size in every other dim. Backward: slices of
/// g.
Tensor cat(const std::vector<Tensor>& xs, int64_t dim);
/// Joins same-shape tensors along a new dim at `dim` (from -(ndim+1) to ndim).
/// Composite (unsqueeze, cat).
Tensor stack(const std::vector<Tensor>& xs, int64_t dim);
/// Views of consecutive pieces of `size` (positive) along dim; the last may be smaller.
/// Composite (slice).
std::vector<Tensor> split(const Tensor& x, int64_t size, int64_t dim);
/// Views of consecutive pieces of the given sizes along dim; sizes are non-negative and add up to
/// the dim's size. Composite (slice).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
/// Views of pieces of ceil(n/chunks) along dim of size n, the last possibly smaller: fewer than
/// `chunks` pieces when n does not divide evenly (6 in 4 chunks gives 3). Composite (slice).
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim);
/// A view of x broadcast to shape, without copying (stride 0 on expanded dims): new dims go in
/// front, a dim of size 1 may grow, -1 keeps a dim. x itself when the shape is unchanged.
/// Backward: sum_to(g).
Tensor expand(const Tensor& x, const Shape& shape);
/// x with dims start_dim..end_dim (inclusive) merged into one; a 0-d x gives shape [1].
/// Composite (reshape).
Tensor flatten(const Tensor& x, int64_t start_dim = 0, int64_t end_dim = -1);
/// A view of x without dim if that dim has size 1; otherwise x itself. Composite (reshape).
Tensor squeeze(const Tensor& x, int64_t dim);
/// A view of x with a new dim of size 1 at `dim` (from -(ndim+1) to ndim). Composite (reshape).
Tensor unsqueeze(const Tensor& x, int64_t dim);
/// Constant padding; pads lists (before, after) pairs starting from the last dim, as
/// torch.nn.functional.pad, for at most x.dim() dims. Negative padding throws (use slice); x is
/// float32 or float64. A new tensor. Backward: slices of g.
Tensor pad(const Tensor& x, const std::vector<int64_t>& pads, double value = 0.0);
/// The gradient of slice, itself an op: zeros of input_shape holding g at
/// x[start:end:step] along dim (bounds as slice takes them); g must have that slice's shape.
/// Backward: d/dg = slice(gg).
Tensor slice_backward(const Tensor& g, const Shape& input_shape, int64_t dim, int64_t start, int64_t end, int64_t step);
/// @}

/// @name Copies
/// @{

/// A new contiguous copy of x (any dtype). Backward: g.
Tensor clone(const Tensor& x);
/// Note [Channels-last]
/// A 4-D [N, C, H, W] tensor may be stored channels-last ([N, H, W, C] in memory, strides
/// channels_last_strides(): Tensor::is_channels_last()), the layout oneDNN's fastest CPU
/// convolutions run on without reordering (docs/benchmarks.md, "Channels-last"). Its shape, its
/// indexing and every op's result are the same as a contiguous tensor's, to rounding (a reduction
/// sums in memory order); only speed differs.
/// - Who chooses it: a convolution asked to by Conv2dOptions::memory_format or
///   ConvTranspose2dOptions::memory_format (nn::Conv2dConfig::channels_last, and the same in
///   nn::ConvTranspose2dConfig), for its output and, in its backward, the input's gradient,
///   in the passes its backend runs on channels-last activations (Backend::channels_last_conv:
///   oneDNN's float32 and bfloat16 CPU paths, and the CPU's own input gradient of a one-channel
///   input, in any float dtype). The other passes (float64, CUDA, our other CPU kernels) take
///   contiguous copies and give contiguous results: the option costs nothing where it does not
///   help.
/// - Who keeps it, as PyTorch's channels_last does: elementwise ops give a channels-last result
///   where the first operand of the result's shape is one; layer_norm over [C, H, W] and batch_norm
///   of a 4-D tensor do (their kernels read the [N, H, W, C] memory in place); clone (and so a
///   reshape or flatten that must copy) gives a contiguous result, and its gradient back in the
///   input's layout, so that a backward keeps the forward's layouts. Everything else (pooling, ...)
///   gives contiguous results.
/// - `x.contiguous(MemoryFormat::ChannelsLast)` converts a tensor (a view when x has one channel:
///   the same memory).
///
/// x in `format`: x itself when it is already (is_contiguous(), is_channels_last()), a view when its
/// memory already is (a size-1 dim's stride aside), else a copy. ChannelsLast needs a 4-D x
/// (ef::Error otherwise). Backward: g.
Tensor contiguous(const Tensor& x, MemoryFormat format);
/// x converted to dtype t; x itself when it already has it. Recorded only between float32 and
/// float64 (a conversion to or from int64 carries no gradient). Backward: g.to(x.dtype).
Tensor to_dtype(const Tensor& x, DType t);
/// x copied to device d; x itself when it is already there. An unknown device throws.
/// Backward: g.to(x.device).
Tensor to_device(const Tensor& x, const Device& d);
/// @}

/// @name Linear algebra and convolution
/// Float32 or float64 operands of one dtype and device.
/// @{

/// Note [bfloat16 compute]
/// Matrix products and convolutions take `compute`: kBFloat16 multiplies the operands rounded to
/// bfloat16 and accumulates the products in float32 (the numerics of bfloat16 tensor cores and of
/// oneDNN's bfloat16 kernels), with float32 operands and output; any other value (the default,
/// kFloat32) computes in the operands' own dtype, float32 or float64. The ops their backward runs
/// take the same setting, so a gradient, and the gradient of a gradient (a penalty's), are products
/// in bfloat16 too; everything else (elementwise ops, reductions, normalizations, losses, the
/// penalty's norm) stays float32, and so do the weights and the optimizer's state. Where a backend
/// has bfloat16 kernels for a case (Backend::bf16_conv, Backend::bf16_gemm: on the CPU oneDNN's,
/// for convolutions of 16 or more input channels a group on AVX-512, for matrix products with
/// every side 16 or more with AVX512-BF16; on CUDA cuBLAS's for every product, and cuDNN's for a
/// convolution where cuda_math().benchmark timed them faster) they run it; elsewhere the op rounds
/// the operands and runs the float32 kernels. Both compute the same products, summed in their own
/// orders: results agree to float32 rounding on every CPU and on CUDA (unless, on CUDA, a
/// convolution may round its result to bfloat16: CudaMath::allow_bf16_conv_results, off by
/// default, as autocast's convolutions do). A convolution converts each operand once for the
/// passes of its node and of its backward, and keeps the copy as long as the node (Note [bfloat16
/// operands converted once] in ops/conv.cpp).

/// How a matrix product computes (Note [bfloat16 compute]).
struct MatmulOptions {
  DType compute = kFloat32;  ///< kBFloat16: bfloat16-rounded operands, float32 accumulation
};
/// [..., M, K] x [..., K, N] -> [..., M, N], batch dims broadcast. Both operands have at least 2
/// dims. Backward: dA = g·Bᵀ, dB = Aᵀ·g (summed to each shape), with the same options.
Tensor matmul(const Tensor& a, const Tensor& b, const MatmulOptions& o = {});
/// x [..., in], weight [out, in], bias [out] (optional): x·Wᵀ + b.
/// Backward: dx = g·W, dW = gᵀ·x, db = Σg (the products with the same options).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), const MatmulOptions& o = {});

/// Options of conv2d and its gradient ops, as PyTorch's Conv2d: each pair is (height, width).
struct Conv2dOptions {
  /// Step between windows (positive).
  std::pair<int64_t, int64_t> stride{1, 1}, padding{0, 0}, dilation{1, 1};
  /// @var Conv2dOptions::padding
  /// Zero padding added to both sides of the input (non-negative).

  /// @var Conv2dOptions::dilation
  /// Spacing between kernel taps (positive).

  int64_t groups = 1;        ///< channel groups (positive); divides the input and output channels
  DType compute = kFloat32;  ///< kBFloat16: bfloat16-rounded operands (Note [bfloat16 compute])
  /// ChannelsLast: the passes the backend runs on channels-last activations take and give them
  /// (y, and in the backward the input's gradient); the others stay contiguous (Note
  /// [Channels-last]). Any input layout is taken either way.
  MemoryFormat memory_format = MemoryFormat::Contiguous;
};
/// x [N, C, H, W], weight [O, C/groups, kh, kw], bias [O] (optional) -> [N, O, OH, OW], with
/// OH = (H + 2·padding - dilation·(kh - 1) - 1)/stride + 1 (rounded down), likewise OW; a padded
/// input smaller than the dilated kernel throws. Backward: dx = conv2d_input_grad(g, weight),
/// dweight = conv2d_weight_grad(x, g), dbias = g summed over N, OH and OW.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), const Conv2dOptions& o = {});
/// The gradient of conv2d with respect to its input, itself an op (Note [Conv double backward] in
/// ops/conv.cpp): gy [N, O, OH, OW] is the output gradient of conv2d(x, weight) with options o and x
/// of input_shape; returns [input_shape].
/// Backward: d/dgy = conv2d(gg, weight), d/dweight = conv2d_weight_grad(gg, gy).
Tensor conv2d_input_grad(const Tensor& gy, const Tensor& weight, const Shape& input_shape, const Conv2dOptions& o);
/// The gradient of conv2d with respect to its weight, itself an op (see that Note): x is the
/// convolution's input, gy its output gradient; returns [weight_shape].
/// Backward: d/dx = conv2d_input_grad(gy, gg), d/dgy = conv2d(x, gg).
Tensor conv2d_weight_grad(const Tensor& x, const Tensor& gy, const Shape& weight_shape, const Conv2dOptions& o);

/// Options of conv_transpose2d, as PyTorch's ConvTranspose2d: each pair is (height, width).
struct ConvTranspose2dOptions {
  /// Stride of the convolution this op transposes (see Conv2dOptions).
  std::pair<int64_t, int64_t> stride{1, 1}, padding{0, 0}, output_padding{0, 0}, dilation{1, 1};
  /// @var ConvTranspose2dOptions::padding
  /// Padding of the convolution this op transposes: removes that many rows and columns from each
  /// side of the output.

  /// @var ConvTranspose2dOptions::output_padding
  /// Extra rows and columns added at the bottom and right of the output (smaller than the stride).

  /// @var ConvTranspose2dOptions::dilation
  /// Dilation of the convolution this op transposes.

  int64_t groups = 1;        ///< channel groups (positive); divides the input channels
  DType compute = kFloat32;  ///< kBFloat16: bfloat16-rounded operands (Note [bfloat16 compute])
  /// The output's layout, and in the backward the input's gradient's, where the backend runs the
  /// pass so (Note [Channels-last]), as Conv2dOptions::memory_format.
  MemoryFormat memory_format = MemoryFormat::Contiguous;
};
/// x [N, C, H, W], weight [C, O/groups, kh, kw] (PyTorch's layout): conv2d_input_grad in disguise.
/// Returns [N, O, OH, OW], OH = (H - 1)·stride - 2·padding + dilation·(kh - 1) + output_padding +
/// 1, likewise OW; bias [O] (optional). output_padding must be smaller than the stride or the
/// dilation (PyTorch's rule; Note [Output padding past the stride] in ops/conv.cpp), or it throws.
/// Backward: that of conv2d_input_grad, plus db = Σg over N, OH and OW.
Tensor conv_transpose2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(),
                        const ConvTranspose2dOptions& o = {});
/// @}

/// @name Pooling, resampling
/// Float32 or float64 input of shape [N, C, H, W].
/// @{

/// Options of max_pool2d and avg_pool2d, as PyTorch's: each pair is (height, width).
struct Pool2dOptions {
  std::pair<int64_t, int64_t> kernel{2, 2};                          ///< window size (positive)
  std::optional<std::pair<int64_t, int64_t>> stride = std::nullopt;  ///< default: kernel
  /// Implicit padding on both sides, at most half the (dilated) window.
  std::pair<int64_t, int64_t> padding{0, 0}, dilation{1, 1};
  /// @var Pool2dOptions::dilation
  /// Spacing between window taps (positive; avg_pool2d takes 1 only).

  /// Round the output size up, so that a last partial window counts (if it starts inside the input
  /// or its left padding); max_pool2d only.
  bool ceil_mode = false;
  bool count_include_pad = true;  ///< avg_pool2d only: padding counts in each window's divisor
};

/// The maximum of each window -> [N, C, OH, OW], with
/// OH = (H + 2·padding - dilation·(kh - 1) - 1)/stride + 1 rounded down (up with ceil_mode),
/// likewise OW. Padding never wins; a window holding a NaN gives NaN.
/// Backward: scatter_add of g at the argmax.
Tensor max_pool2d(const Tensor& x, const Pool2dOptions& o);
/// The mean of each window (output size as max_pool2d's); ceil_mode and a dilation other than 1
/// throw. Composite (depthwise conv2d).
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& o);
/// Averages x to [N, C, OH, OW] = output_size (positive): output row i averages input rows
/// floor(i·H/OH) to ceil((i+1)·H/OH) - 1 (PyTorch's bins), likewise columns. Composite (matmul).
Tensor adaptive_avg_pool2d(const Tensor& x, std::pair<int64_t, int64_t> output_size);
/// Bilinear resize to output_size (positive), with PyTorch's source coordinates: align_corners maps
/// the corner pixels' centres onto each other; otherwise centres scale by in/out, clamped at 0.
/// Composite (matmul).
Tensor upsample_bilinear2d(const Tensor& x, std::pair<int64_t, int64_t> output_size, bool align_corners);
/// Nearest-neighbour resize to output_size (positive): output row i copies input row
/// floor(i·H/OH), likewise columns (PyTorch's mode "nearest"). Composite (index_select).
Tensor upsample_nearest2d(const Tensor& x, std::pair<int64_t, int64_t> output_size);

/// The three ops above resize x [N, C, H, W] to (OH, OW) with constant operands that depend only on
/// the sizes: matrices rows [OH, H] and cols [OW, W] applied as rows·x·colsᵀ (adaptive average,
/// bilinear), or the source row and column of each output pixel, int64, gathered (nearest). They
/// are made on the host and copied to the device at every call, which a recorded step may not do
/// (Note [A step that can be replayed] in step_graph.h); a layer makes them once per input size
/// with resampling() and applies them with resample2d() (nn::Upsample and nn::AdaptiveAvgPool2d do).
enum class ResampleMode { AdaptiveAverage, Bilinear, BilinearAlignCorners, Nearest };
/// The operands of one resize (see ResampleMode).
struct Resampling {
  Tensor rows;                     ///< [OH, H] of the input's dtype, or [OH] int64 (nearest)
  Tensor cols;                     ///< [OW, W], or [OW] int64
  std::pair<int64_t, int64_t> in;  ///< (H, W): the input size they resize
};
/// The operands resizing (H, W) = `in` to `out` (both positive, else ef::Error), of `opts.dtype`
/// (float32 or float64; int64 indices for Nearest) on `opts.device`.
Resampling resampling(ResampleMode mode, std::pair<int64_t, int64_t> in, std::pair<int64_t, int64_t> out,
                      const TensorOptions& opts);
/// x [N, C, H, W] resized with `r` (made for x's H and W, dtype and device, else ef::Error):
/// the value adaptive_avg_pool2d, upsample_bilinear2d or upsample_nearest2d gives. Composite.
Tensor resample2d(const Tensor& x, const Resampling& r);
/// @}

/// @name Softmax, indexing, dropout
/// Indices are int64 tensors on the input's device; an index out of range throws.
/// @{

/// exp(x) normalized to sum 1 along dim (a 0-d x gives 1). Backward: y·(g - Σ g·y), y = softmax(x).
Tensor softmax(const Tensor& x, int64_t dim);
/// log(softmax(x)) along dim, computed stably (a 0-d x gives 0). Backward: g - softmax(x)·Σ g.
Tensor log_softmax(const Tensor& x, int64_t dim);
/// torch.gather: out[i][j] = x[index[i][j]][j] for dim 0, likewise for other dims. index has x's
/// number of dims and is no larger than x in any dim but dim; the output has index's shape.
/// Backward: scatter_add(0, dim, index, g).
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);
/// A copy of base with src added at index (torch.scatter_add, not in place): out[index[i][j]][j] +=
/// src[i][j] for dim 0. src has index's shape; index as for gather.
/// Backward: base: g, src: gather(g).
Tensor scatter_add(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src);
/// The entries of x at a 1-D index along dim (repeats allowed): that dim's size becomes
/// index.numel(). Backward: index_add(0, dim, index, g).
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);
/// A copy of base with src's entries added at a 1-D index along dim (not in place; repeated indices
/// accumulate): src has base's shape but index.numel() along dim.
/// Backward: base: g, src: index_select(g).
Tensor index_add(const Tensor& base, int64_t dim, const Tensor& index, const Tensor& src);
/// Checks data about to be used as indices, such as a loss's class targets: every element of the
/// int64 tensor `index` must lie in [0, size) or equal `allowed`. The first that does not makes
/// ef::Error(describe(that value)): thrown here on a CPU device, and on a CUDA device at its next
/// synchronization (item(), a copy to the host), so that checking never stops the GPU's queue.
void check_index_range(const Tensor& index, int64_t size, int64_t allowed,
                       std::function<std::string(int64_t)> describe);
/// Zeroes elements with probability p and scales the rest by 1/(1-p); identity when !training.
/// p is in [0, 1]; x itself when !training or p = 0. The mask is drawn per sample (batch_bernoulli:
/// dim 0 is the batch), so data-parallel replicas draw the masks one device would (Note [Random
/// numbers per sample] in tensor.h). Composite (mul by the mask).
Tensor dropout(const Tensor& x, double p, bool training);
/// @}

/// @name Normalization
/// With the input's own statistics (layer norm; batch norm in training) the forward is one fused
/// kernel and the backward differentiable ops, so they are differentiable to any order (Note [Fused
/// normalization] in ops/normalization.cpp); batch norm in eval is composite. An undefined weight
/// or bias is skipped.
/// @{

/// x [N, C, ...]. Training: normalizes with the batch's statistics and, if given, updates
/// running_mean / running_var in place (unbiased variance, PyTorch's momentum convention).
/// Eval: normalizes with the running statistics.
/// y = (x - mean)/sqrt(var + eps)·weight + bias per channel, var the biased batch variance in
/// training; weight, bias and the running statistics are [C]. Training needs more than one value
/// per channel; eval needs both running statistics. Momentum: running = (1 - momentum)·running +
/// momentum·batch statistic.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum = 0.1, double eps = 1e-5);
/// Normalizes over the last normalized_shape.size() dims.
/// x's shape must end with normalized_shape: y = (x - mean)/sqrt(var + eps)·weight + bias, var the
/// biased variance; weight and bias (optional) have normalized_shape.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
/// @}

/// @name In place
/// Not differentiable; refused on tensors that require grad while grad mode is on. Each bumps the
/// version of the tensor it modifies: backward through a node that saved it then throws (Note
/// [Saved tensor versions] in autograd.cpp).
/// @{

/// Sets every element of x to v.
void fill_(const Tensor& x, double v);
/// Copies src into dst: src is broadcast to dst's shape and converted to dst's dtype on one device;
/// between devices (a batch into a device buffer), src has dst's shape and dtype and dst is
/// contiguous.
void copy_(const Tensor& dst, const Tensor& src);
/// x += alpha·other, other broadcast to x's shape (one dtype, one device).
void add_(const Tensor& x, const Tensor& other, double alpha = 1.0);
/// x += s, one kernel. x is float32, float64 or int64 (then s must be integral): a counter such as
/// batch norm's num_batches_tracked is incremented on its device, as a replayed step needs.
void add_(const Tensor& x, double s);
/// x ·= s; x is float32 or float64.
void mul_(const Tensor& x, double s);
/// One parameter's tensors for adam_: max_exp_avg_sq only with amsgrad.
struct AdamTensors {
  Tensor param;           ///< updated in place
  Tensor grad;            ///< its gradient
  Tensor exp_avg;         ///< first moment, updated in place
  Tensor exp_avg_sq;      ///< second moment, updated in place
  Tensor max_exp_avg_sq;  ///< amsgrad's running maximum of the second moment, updated in place
};
/// One fused Adam/AdamW step (AdamArgs, engine/backend.h) on every entry's param, exp_avg,
/// exp_avg_sq and, with amsgrad, max_exp_avg_sq: one pass over each instead of ten kernels, and the
/// entries together (on CUDA one launch for up to 32 of them). One device and one dtype for all; an
/// entry's tensors share its param's shape.
void adam_(const AdamArgs& args, const std::vector<AdamTensors>& params);
/// @}

/// @name Operators
/// Shorthands for the ops above, with their checks and gradients.
/// @{

/// add(a, b).
inline Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
/// sub(a, b).
inline Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
/// mul(a, b).
inline Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
/// div(a, b).
inline Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
/// neg(x).
inline Tensor operator-(const Tensor& x) {
  return neg(x);
}
/// add_scalar(x, s).
inline Tensor operator+(const Tensor& x, double s) {
  return add_scalar(x, s);
}
/// add_scalar(x, s).
inline Tensor operator+(double s, const Tensor& x) {
  return add_scalar(x, s);
}
/// add_scalar(x, -s).
inline Tensor operator-(const Tensor& x, double s) {
  return add_scalar(x, -s);
}
/// s - x, as add_scalar(neg(x), s).
inline Tensor operator-(double s, const Tensor& x) {
  return add_scalar(neg(x), s);
}
/// mul_scalar(x, s).
inline Tensor operator*(const Tensor& x, double s) {
  return mul_scalar(x, s);
}
/// mul_scalar(x, s).
inline Tensor operator*(double s, const Tensor& x) {
  return mul_scalar(x, s);
}
/// x / s, as mul_scalar(x, 1/s).
inline Tensor operator/(const Tensor& x, double s) {
  return mul_scalar(x, 1.0 / s);
}
/// s / x, as mul_scalar(reciprocal(x), s).
inline Tensor operator/(double s, const Tensor& x) {
  return mul_scalar(reciprocal(x), s);
}
/// @}

}  // namespace evenflow
