// The kernel interface a backend implements: a small set of non-differentiable kernels over strided
// views of device memory. Shape checks, dtype promotion, autograd and every derivative live above
// it, in the ops (engine/ops/), once for all backends. The CPU backend (cpu/) uses Eigen and
// OpenMP; the CUDA backend (cuda/) uses cuBLAS, cuDNN and kernels of its own.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "evenflow/engine/dtype.h"
#include "evenflow/engine/scalar_ops.h"

namespace evenflow {

inline constexpr int kMaxDims = 8;

// A strided window on one device's memory. Strides count elements and may be 0 (broadcast).
struct View {
  void* data = nullptr;
  DType dtype = DType::Float32;
  int ndim = 0;
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};

  int64_t numel() const {
    int64_t n = 1;
    for (int d = 0; d < ndim; ++d) n *= shape[d];
    return n;
  }
  bool is_contiguous() const {
    int64_t expected = 1;
    for (int d = ndim - 1; d >= 0; --d) {
      if (shape[d] != 1 && strides[d] != expected) return false;
      expected *= shape[d];
    }
    return true;
  }
  // Whether it is a 4-D [N, C, H, W] view with channels-last strides [H·W·C, 1, W·C, C] exactly
  // (Note [Channels-last] in ops.h; Tensor::is_channels_last asks this).
  bool is_channels_last() const {
    const int64_t c = shape[1], h = shape[2], w = shape[3];
    return ndim == 4 && strides[0] == h * w * c && strides[1] == 1 && strides[2] == w * c && strides[3] == c;
  }
};

// Row-major batched GEMM: C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b], op(A) is [m, k],
// op(B) is [k, n], C is [m, n]. lda/ldb/ldc are row strides of the stored (untransposed) matrices.
struct GemmArgs {
  DType dtype = DType::Float32;
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0, batch = 1;
  const void* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  void* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  double alpha = 1.0, beta = 0.0;
  // BFloat16: the float32 operands are multiplied as bfloat16 (rounded by the kernel) with float32
  // accumulation; only where the backend said it can (Backend::bf16_gemm). Float32: as given.
  DType compute = DType::Float32;
};

// One Adam or AdamW step on one parameter, in the order of the unfused formula (so both agree
// bitwise on the CPU), every scalar rounded to the parameter's dtype:
//   p ← p·decay;  g ← grad + weight_decay·p;  m ← β1·m + (1-β1)·g;  v ← β2·v + (1-β2)·g²;
//   s ← amsgrad ? (v_max ← max(v_max, v)) : v;  p ← p + step·m / (√s·inv_bias_correction2_sqrt + eps)
// with step = -lr / bias_correction1 (the caller computes the scalars).
//
// Note [Adam moments flush to zero]
// A moment whose magnitude falls below the dtype's smallest normal number is stored as 0. A
// parameter whose gradient stays 0 (the weights of a dead ReLU unit) sees m shrink by β1 each step,
// into subnormal numbers after ~700 steps, and x86 CPUs compute on subnormals through slow microcode
// assists: classify's later epochs slowed down, much of it in this kernel (docs/benchmarks.md,
// "classify (the FashionMNIST CNN, ...)").
// The values flushed are below 1e-38 (float32); the update they would make is below lr·1e-30.
struct AdamArgs {
  double decay = 1, weight_decay = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double inv_bias_correction2_sqrt = 1, step = 0;
  bool amsgrad = false;
  // In a recorded step (Note [Step scalars] in step_graph.cpp): device memory holding the AdamArgs
  // of each replay, which the kernel reads when it runs instead of the fields above (all but
  // amsgrad, which shapes the call). nullptr: the fields above.
  const AdamArgs* in_device = nullptr;
};

// A random draw's key: element i is random::sample(kind, a, b, seed, offset + i). In a recorded
// step (Note [Step scalars] in step_graph.cpp) `in_device` points to device memory holding {seed,
// offset} for each replay, read by the kernel when it runs; nullptr: the fields.
struct RandomKey {
  uint64_t seed = 0, offset = 0;
  const uint64_t* in_device = nullptr;
};

// Normalization by statistics of the input itself (layer norm; batch norm in training): x is a
// contiguous [outer, groups, inner] view and each group g normalizes its outer x inner elements
// (batch norm: [N, C, H*W], a group per channel; layer norm: [1, rows, features], a group per row).
// The kernel writes the group's mean, biased variance and rstd (contiguous [groups], x's dtype) and
//   y = (x - mean) * rstd * weight + bias,  rstd = 1 / sqrt(var + eps)
// rounded to x's dtype after each operation, as the unfused ops round. weight and bias are optional
// (a view with null data when absent), contiguous, [groups] when affine_per_group (batch norm) and
// [inner] otherwise (layer norm). Where param_channels = C is not 0 (a layer norm over [C, H, W]
// of a channels-last input, whose group's features come in H, W, C order), per-feature parameters
// -- and the gradients the backward kernels write for them -- are in their own [C, H, W] order:
// feature i of a group is parameter (i % C)·(inner / C) + i / C.
struct NormArgs {
  int64_t outer = 1, groups = 1, inner = 1;
  double eps = 1e-5;
  bool affine_per_group = false;
  int64_t param_channels = 0;
};

// A batch norm's running statistics, which Backend::normalize updates where their data is given:
//   mean[g] = mean[g]·keep + mean_weight·(the group's mean)
//   var[g] = var[g]·keep + var_weight·(the group's biased variance)
// each product and sum rounded to x's dtype (no fused multiply-add): PyTorch's update with keep =
// 1 - momentum, mean_weight = momentum and var_weight = momentum·n / (n - 1) (the unbiased
// variance), and the bits of the MulScalar and AddScaled kernels the op ran until 2026-12-01 (four
// kernels a batch norm more). Contiguous [groups] views of x's dtype; either may be empty (null data).
struct RunningStats {
  View mean, var;
  double keep = 1, mean_weight = 0, var_weight = 0;
};

// One parameter's operands of the Adam step: contiguous views of one shape; max_exp_avg_sq is an
// empty view (null data) without amsgrad.
struct AdamOperands {
  View param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq;
};

// 2-D convolution geometry, NCHW input, OIHW weight (O = c_out, I = c_in / groups).
struct ConvArgs {
  int64_t n = 0, c_in = 0, h = 0, w = 0;
  int64_t c_out = 0, kh = 0, kw = 0;
  int64_t oh = 0, ow = 0;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
  int64_t groups = 1;
  // BFloat16: the float32 operands are multiplied as bfloat16 (rounded by the kernel) with float32
  // accumulation; only where the backend said it can (Backend::bf16_conv). Float32: as given.
  DType compute = DType::Float32;
  // The activations (x and y, or their gradients) are channels-last: NCHW-shaped views with NHWC
  // strides (Note [Channels-last] in ops.h); only where the backend said it can
  // (Backend::channels_last_conv). The weight is OIHW, but OHWI (channels-last too) for bfloat16
  // compute: the op converts it so, from which oneDNN's reorder into its blocked layouts runs faster
  // (docs/benchmarks.md, "Convolution operands converted to bfloat16 once").
  bool channels_last = false;
};

// The three passes of a convolution, for Backend::bf16_conv.
enum class ConvPass { Forward, InputGrad, WeightGrad };

struct PoolArgs {
  int64_t n = 0, c = 0, h = 0, w = 0, oh = 0, ow = 0;
  int64_t kh = 1, kw = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
};

// A contiguous view of `shape` at `data`.
inline View contiguous_view(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  View v;
  v.data = data;
  v.dtype = dtype;
  v.ndim = static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int d = v.ndim; d-- > 0;) {
    v.shape[d] = shape.begin()[d];
    v.strides[d] = stride;
    stride *= v.shape[d];
  }
  return v;
}

// A contiguous [C] view broadcast over a [N, C, H, W] view y (stride 0 except along C): a
// per-channel bias as binary() takes it.
inline View channel_broadcast(const View& bias, const View& y) {
  View b = y;
  b.data = bias.data;
  b.dtype = bias.dtype;
  for (int d = 0; d < b.ndim; ++d) b.strides[d] = 0;
  b.strides[1] = 1;
  return b;
}

class Backend {
 public:
  virtual ~Backend() = default;

  // Memory. raw_alloc returns nullptr when the device has no memory left (the caching allocator
  // turns that into an ef::Error with the device's statistics).
  virtual void* raw_alloc(size_t nbytes) = 0;
  virtual void raw_free(void* ptr) = 0;
  // copy_from_host returns as soon as src may be reused; the copy may still be in flight, ordered
  // before any later work on this device. copy_to_host returns when dst holds the bytes.
  virtual void copy_from_host(void* dst, const void* src, size_t nbytes) = 0;
  virtual void copy_to_host(void* dst, const void* src, size_t nbytes) = 0;
  // Queues a copy of nbytes of device memory into host memory `dst` behind the work queued so far
  // and returns a function that waits for it (and throws the device's deferred errors, as
  // synchronize does); dst must stay valid until then. The CPU backend copies at once.
  virtual std::function<void()> copy_to_host_later(void* dst, const void* src, size_t nbytes) = 0;
  // Waits for all work queued on this device (a no-op on CPU devices).
  virtual void synchronize() = 0;

  // Elementwise. Outputs are never aliased with inputs unless the op is an explicit in-place op
  // (then out and the first input are the same view). Inputs arrive already broadcast to out's
  // shape (stride 0 on broadcast dims).
  virtual void fill(const View& out, double value) = 0;
  virtual void arange(const View& out, double start, double step) = 0;  // contiguous 1-D
  virtual void copy(const View& out, const View& x) = 0;                // casts between dtypes
  // Floating dtypes; int64 for AddScalar alone (a counter's in-place increment, `a` integral).
  virtual void unary(UnaryOp op, const View& out, const View& x, double a, double b) = 0;
  virtual void binary(BinaryOp op, const View& out, const View& x, const View& y, double a) = 0;
  virtual void where(const View& out, const View& cond, const View& x, const View& y) = 0;
  // out = xs[0] + xs[1] + ... + xs[n - 1], added left to right and rounded after each add: the bits
  // of the n - 1 Add kernels it stands for (autograd's sum of a tensor's gradients, one launch where
  // it took n - 1: Note [Gradients summed in one kernel] in autograd.cpp). Contiguous views of one
  // shape and floating dtype, at least two, out not among them. This default runs those Add kernels.
  virtual void add_n(const View& out, const std::vector<View>& xs) {
    binary(BinaryOp::Add, out, xs[0], xs[1], 0.0);
    for (size_t k = 2; k < xs.size(); ++k) binary(BinaryOp::Add, out, out, xs[k], 0.0);
  }

  // Reduction: out has x's ndim; each dim of out is either x's size or 1 (a reduced dim).
  // ArgMax/ArgMin write int64 indices and reduce exactly one dim.
  virtual void reduce(ReduceOp op, const View& out, const View& x) = 0;

  virtual void gemm(const GemmArgs& args) = 0;
  // Whether this backend runs this float32 product with bfloat16 operands itself
  // (GemmArgs::compute); otherwise the op rounds the operands and calls the float32 kernel (Note
  // [bfloat16 compute] in ops.h: the same products).
  virtual bool bf16_gemm(const GemmArgs& args) const {
    (void)args;
    return false;
  }

  // Convolution kernels; every view is contiguous, but the activations where args.channels_last. conv2d_input_grad and
  // conv2d_weight_grad overwrite their outputs. conv2d adds `bias` ([c_out]; an empty view when there is none) to every
  // output channel, inside the convolution where the kernel can, saving a pass over y.
  virtual void conv2d(const ConvArgs& args, const View& y, const View& x, const View& w, const View& bias) = 0;
  virtual void conv2d_input_grad(const ConvArgs& args, const View& gx, const View& gy, const View& w) = 0;
  virtual void conv2d_weight_grad(const ConvArgs& args, const View& gw, const View& x, const View& gy) = 0;
  // Whether this backend runs `pass` of this float32 convolution with bfloat16 operands itself
  // (ConvArgs::compute); otherwise the op rounds the operands and calls the float32 kernel (Note
  // [bfloat16 compute] in ops.h: the same products). Not const: to answer, the CUDA backend builds
  // and times the shape's cuDNN plan, and keeps both for the calls that follow.
  virtual bool bf16_conv(const ConvArgs& args, ConvPass pass) {
    (void)args;
    (void)pass;
    return false;
  }
  // Whether this backend runs `pass` of this convolution of `dtype` tensors on channels-last
  // activations (ConvArgs::channels_last, with args.compute final); otherwise the op gives it
  // contiguous ones.
  virtual bool channels_last_conv(const ConvArgs& args, ConvPass pass, DType dtype) {
    (void)args;
    (void)pass;
    (void)dtype;
    return false;
  }

  // The fused normalization forward of NormArgs (Note [Fused normalization] in ops/normalization.cpp).
  // Its rstd is rounded after the sum and the square root, as AddScalar and Rsqrt round: the same
  // bits as those ops on `var` (which the backward passes took until 2026-12-01: two more kernels).
  // `running`: a batch norm's running statistics to update (RunningStats; empty views: none).
  virtual void normalize(const NormArgs& args, const View& y, const View& mean, const View& var, const View& rstd,
                         const View& x, const View& weight, const View& bias, const RunningStats& running) = 0;
  // Its first-order gradient, for a backward whose own graph is not needed: with x̂ = (x - mean)·rstd
  // and ĝ = gy·weight over a group's n elements,
  //   gx = rstd·(ĝ - Σĝ/n - x̂·Σ(ĝ·x̂)/n),  gw = Σ gy·x̂,  gb = Σ gy
  // (gw and gb summed over everything but the affine dim). gy and x are contiguous like normalize's
  // x; mean and rstd contiguous [groups]; weight as in normalize. gx, gw and gb (shaped like x,
  // weight, bias) are overwritten, each skipped when its data is null.
  virtual void normalize_backward(const NormArgs& args, const View& gx, const View& gw, const View& gb, const View& gy,
                                  const View& x, const View& mean, const View& rstd, const View& weight) = 0;
  // Its second-order gradient, for a double backward whose own graph is not needed (Note [Fused
  // normalization] in ops/normalization.cpp): given ggx, ggw and ggb, the gradients reaching gx,
  // gw and gb (shaped like x, weight, weight; a view with null data is zero), writes the gradients
  // of gy, x and weight (dgy and dx like x, dw like weight; each skipped when its data is null).
  // Operands as in normalize_backward. Returns false, writing nothing, where the backend has no
  // kernel for `args`: the op then computes the same formula with differentiable ops.
  virtual bool normalize_double_backward(const NormArgs& args, const View& dgy, const View& dx, const View& dw,
                                         const View& ggx, const View& ggw, const View& ggb, const View& gy,
                                         const View& x, const View& mean, const View& rstd, const View& weight) {
    (void)args, (void)dgy, (void)dx, (void)dw, (void)ggx, (void)ggw, (void)ggb, (void)gy, (void)x, (void)mean,
        (void)rstd, (void)weight;
    return false;
  }

  // Softmax or log-softmax over the last dim of a contiguous [rows, cols] view.
  virtual void softmax(const View& out, const View& x, bool log) = 0;
  // The same over dim 1 of a contiguous [outer, cols, inner] view (a segmentation's classes of each
  // pixel), without moving that dim last; only where has_softmax_dim1() (else the op moves the dim
  // last and calls softmax, and this is never called).
  virtual bool has_softmax_dim1() const { return false; }
  virtual void softmax_dim1(const View& out, const View& x, bool log) { (void)out, (void)x, (void)log; }

  // Max pooling over contiguous NCHW; indices (int64) are flat positions within each H*W plane.
  // Padding never wins (it acts as -infinity).
  virtual void max_pool2d(const PoolArgs& args, const View& out, const View& indices, const View& x) = 0;
  // Its gradient: gx (contiguous NCHW, overwritten) gets each element of gy (contiguous) at the
  // index max_pool2d wrote for it, summed where windows overlap, zero elsewhere.
  virtual void max_pool2d_backward(const PoolArgs& args, const View& gx, const View& gy, const View& indices) = 0;

  // torch.gather / scatter_add semantics along `dim`; index is int64, contiguous, shaped like out
  // (gather) or src (scatter_add). scatter_add adds into out, which holds its initial values.
  virtual void gather(const View& out, const View& x, int dim, const View& index) = 0;
  virtual void scatter_add(const View& out, int dim, const View& index, const View& src) = 0;
  // index_select / index_add along `dim` with a 1-D int64 index; index_add adds into out.
  virtual void index_select(const View& out, const View& x, int dim, const View& index) = 0;
  virtual void index_add(const View& out, int dim, const View& index, const View& src) = 0;

  // Checks data about to be used as indices (a loss's class targets): every element of the
  // contiguous int64 `index` must lie in [0, size) or equal `allowed`. For the first that does not,
  // ef::Error(describe(value)) is thrown: at once on the CPU; on CUDA at the next synchronization
  // (Note [Index checks] in cuda/deferred_errors.h), so that the check does not stop the device's queue.
  virtual void check_index_range(const View& index, int64_t size, int64_t allowed,
                                 std::function<std::string(int64_t)> describe) = 0;

  // The fused optimizer step of AdamArgs on several parameters at once (a multi-tensor step: on
  // CUDA a few kernel launches for a whole model rather than one per parameter), in place on each
  // param, exp_avg, exp_avg_sq (and max_exp_avg_sq when amsgrad). One dtype throughout.
  virtual void adam(const AdamArgs& args, const std::vector<AdamOperands>& params) = 0;

  // Fills a contiguous view with random::sample(kind, a, b, seed, offset + i), the key's.
  virtual void random(const View& out, RandomKind kind, double a, double b, const RandomKey& key) = 0;
};

}  // namespace evenflow
